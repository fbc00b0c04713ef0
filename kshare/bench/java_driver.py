"""Apache Kafka's own Java ``KafkaShareConsumer`` as a command line: ``tests/java/ShareConsumerDriver.java``,
built on first use into the cache (kafka-clients from Maven Central, then javac). The tests
(``tests.harness.java``) and the bench's budget part (``--client java``) run it."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("kshare.bench.java_driver")


# the sources live beside the tests that use the driver most; the bench (budget part) runs from the repository too
JAVA_DIR = Path(__file__).resolve().parents[2] / "tests" / "java"
JAVA_SOURCES = (JAVA_DIR / "pom.xml", JAVA_DIR / "ShareConsumerDriver.java")


def java_share_driver(timeout: float = 600.0) -> list[str]:
    """The command line running ShareConsumerDriver, built on first use.

    kafka-clients and slf4j-simple are resolved from Maven Central (tests/java/pom.xml) and the
    driver compiled with javac into ``<cache_root()>/share-driver-<digest>``, where the digest
    covers the pom and the source: later calls (and later sessions) reuse the build. A lock file
    serialises concurrent builders; a half-finished build is redone.
    """
    import fcntl
    import hashlib
    import shutil
    import subprocess

    from kshare.bench.brokers import _java
    from kshare.embedded.distribution import cache_root

    if not all(p.is_file() for p in JAVA_SOURCES):
        raise RuntimeError(f"the Java share consumer driver's sources are not in {JAVA_DIR} (run from a kshare checkout)")

    digest = hashlib.sha256(b"".join(p.read_bytes() for p in JAVA_SOURCES)).hexdigest()[:16]
    root = cache_root() / f"share-driver-{digest}"
    libs, classes, marker = root / "libs", root / "classes", root / ".complete"
    java = _java()
    javac = str(Path(java).with_name("javac"))
    if not Path(javac).is_file():
        javac = shutil.which("javac") or "javac"
    command = [java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-Xmx256m",
               "-Djava.net.preferIPv4Stack=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{classes}{os.pathsep}{libs}/*", "ShareConsumerDriver"]
    if marker.is_file():
        return command
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"share-driver-{digest}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.is_file():
                return command
            t0 = time.monotonic()
            for stale in (libs, classes):
                shutil.rmtree(stale, ignore_errors=True)
            mvn = shutil.which("mvn")
            if mvn is None:
                raise RuntimeError("Maven (mvn) is not on PATH; it is needed to fetch kafka-clients")
            partial = root / "libs.partial"
            for offline in (True, False):  # from the local Maven repository if it has it all (faster)
                shutil.rmtree(partial, ignore_errors=True)
                proc = subprocess.run(
                    [mvn, "-B", "-q", *(["-o"] if offline else []), "-f", str(JAVA_DIR / "pom.xml"),
                     "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={partial}"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
                if proc.returncode == 0 and list(partial.glob("kafka-clients-*.jar")):
                    break
            if proc.returncode != 0 or not list(partial.glob("kafka-clients-*.jar")):
                raise RuntimeError(f"Maven failed to fetch kafka-clients (exit {proc.returncode}):\n"
                                   + "\n".join(proc.stdout.splitlines()[-30:]))
            partial.rename(libs)
            out = root / "classes.partial"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run(
                [javac, "-nowarn", "-d", str(out), "-cp", f"{libs}/*", str(JAVA_DIR / "ShareConsumerDriver.java")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"javac failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
            out.rename(classes)
            marker.write_text(json.dumps({"digest": digest, "seconds": round(time.monotonic() - t0, 1),
                                          "jars": sorted(p.name for p in libs.glob("*.jar"))}) + "\n")
            log.info("built ShareConsumerDriver in %s in %.1f s", root, time.monotonic() - t0)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return command

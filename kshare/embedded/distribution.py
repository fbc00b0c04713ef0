"""Apache Kafka's jars from Maven Central, fetched once into the user's cache.

A release is described by a manifest shipped with kshare (``kafka-<version>.json`` beside this
module): every runtime jar of the ``kafka_2.13`` broker with its repository path, size and SHA-1,
as Maven resolved them from ``kshare/bench/kafka/pom.xml`` (:func:`write_manifest` made it). With a
manifest, fetching needs no Maven: the jars are downloaded in parallel over HTTPS, checked against
their SHA-1 and renamed into ``<cache>/kafka-<version>/libs``; a marker written last makes later
calls return at once, a lock serialises concurrent callers (two proxies, test workers), and a
fetch cut short is started again from scratch. ``kshare proxy``'s embedded broker and the tests'
brokers fetch through here, so one download serves both.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kshare.embedded")

MARKER = ".complete"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
_HERE = Path(__file__).resolve().parent


class FetchError(RuntimeError):
    """The jars of a release could not be fetched."""


def cache_root() -> Path:
    """``$KSHARE_CACHE`` or ``~/.cache/kshare``."""
    env = os.environ.get("KSHARE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kshare"


def repository() -> str:
    """The Maven repository to fetch from: ``$KSHARE_MAVEN_REPOSITORY`` (a mirror) or Maven Central."""
    return os.environ.get("KSHARE_MAVEN_REPOSITORY", MAVEN_CENTRAL).rstrip("/")


@dataclass(frozen=True)
class Jar:
    path: str  # in the repository, e.g. org/apache/kafka/kafka_2.13/3.9.2/kafka_2.13-3.9.2.jar
    size: int
    sha1: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


@dataclass(frozen=True)
class Manifest:
    version: str
    jars: tuple[Jar, ...]
    digest: str  # of the manifest file: a changed manifest fetches again

    @property
    def size(self) -> int:
        return sum(j.size for j in self.jars)


def manifest_path(version: str) -> Path:
    return _HERE / f"kafka-{version}.json"


def load_manifest(version: str) -> Manifest | None:
    """The shipped manifest of ``version``, or None when kshare ships none for it."""
    path = manifest_path(version)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    doc = json.loads(raw)
    jars = tuple(Jar(j["path"], int(j["size"]), j["sha1"]) for j in doc["jars"])
    return Manifest(doc["version"], jars, hashlib.sha256(raw).hexdigest()[:16])


def libs_dir(version: str) -> Path:
    return cache_root() / f"kafka-{version}" / "libs"


def read_marker(version: str) -> dict | None:
    try:
        return json.loads((cache_root() / f"kafka-{version}" / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(version: str, recipe: str) -> bool:
    """A finished fetch of ``version`` made by ``recipe`` (a manifest's or a pom's digest)."""
    marker = read_marker(version)
    return (marker is not None and marker.get("recipe") == recipe
            and (libs_dir(version) / f"kafka_2.13-{version}.jar").is_file())


@contextlib.contextmanager
def locked(version: str, timeout: float) -> Iterator[None]:
    """Hold the fetch lock of ``version`` (other processes wait for the fetch to finish)."""
    version_dir = cache_root() / f"kafka-{version}"
    version_dir.mkdir(parents=True, exist_ok=True)
    lock_path = version_dir.parent / f"kafka-{version}.lock"
    with open(lock_path, "a+") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise FetchError(f"timed out waiting for {lock_path} (another fetch running?)") from e
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(version: str, recipe: str, fill: Callable[[Path], None], **marker: object) -> Path:
    """Fill a private directory with ``fill`` and rename it into place as ``libs``, then write the
    marker. Called with the lock held."""
    version_dir = cache_root() / f"kafka-{version}"
    (version_dir / MARKER).unlink(missing_ok=True)
    for stale in version_dir.glob("libs.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = version_dir / f"libs.partial-{os.getpid()}"
    partial.mkdir()
    t0 = time.monotonic()
    try:
        fill(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not (partial / f"kafka_2.13-{version}.jar").is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise FetchError(f"the fetch of Apache Kafka {version} did not bring kafka_2.13-{version}.jar")
    libs = version_dir / "libs"
    for old in version_dir.glob("libs.old-*"):
        shutil.rmtree(old, ignore_errors=True)
    if libs.exists():
        # Brokers still running from it open jars lazily: move it aside, the next fetch deletes it.
        libs.rename(version_dir / f"libs.old-{os.getpid()}")
    partial.rename(libs)
    doc = {"version": version, "recipe": recipe, "jars": len(list(libs.glob("*.jar"))),
           "seconds": round(time.monotonic() - t0, 1),
           "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **marker}
    tmp = version_dir / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.rename(version_dir / MARKER)
    return libs


Progress = Callable[[int], None]
"""Called with the number of bytes just downloaded."""


def fetch(version: str, *, progress: Callable[[Manifest], contextlib.AbstractContextManager[Progress]] | None = None,
          timeout: float = 1200.0, workers: int = 4) -> Path:
    """The ``libs`` directory of ``version``, downloading its jars first if needed (needs a manifest).

    ``progress(manifest)`` is entered only when a download happens, and its value is called with
    each chunk's size (a progress bar).
    """
    manifest = load_manifest(version)
    if manifest is None:
        raise FetchError(f"kshare ships no manifest for Apache Kafka {version}")
    if is_complete(version, manifest.digest):
        return libs_dir(version)
    with locked(version, timeout):
        if is_complete(version, manifest.digest):  # another process finished while we waited
            return libs_dir(version)
        bar = progress(manifest) if progress is not None else contextlib.nullcontext(lambda n: None)
        t0 = time.monotonic()
        with bar as advance:
            libs = install(version, manifest.digest,
                           lambda target: _download_all(manifest, target, advance, workers, timeout),
                           source=repository())
        log.info("fetched Apache Kafka %s (%d jars, %.0f MB) in %.1f s into %s", version, len(manifest.jars),
                 manifest.size / 1e6, time.monotonic() - t0, libs)
        return libs


def _download_all(manifest: Manifest, target: Path, advance: Progress, workers: int, timeout: float) -> None:
    base = repository()
    deadline = time.monotonic() + timeout
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kshare-fetch") as pool:
        futures = [pool.submit(_download, f"{base}/{jar.path}", jar, target / jar.name, advance, deadline)
                   for jar in manifest.jars]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _download(url: str, jar: Jar, dest: Path, advance: Progress, deadline: float, attempts: int = 3) -> None:
    for attempt in range(1, attempts + 1):
        done = 0
        try:
            digest = hashlib.sha1(usedforsecurity=False)
            remaining = max(1.0, deadline - time.monotonic())
            with urllib.request.urlopen(url, timeout=min(60.0, remaining)) as resp, open(dest, "wb") as out:
                while chunk := resp.read(256 << 10):
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    advance(len(chunk))
            if digest.hexdigest() != jar.sha1:
                raise FetchError(f"{url}: SHA-1 {digest.hexdigest()} is not the expected {jar.sha1}")
            return
        except (OSError, urllib.error.URLError, FetchError) as exc:
            advance(-done)  # the bar goes back: this file starts again
            if attempt == attempts or time.monotonic() > deadline:
                reason = getattr(exc, "reason", exc)
                raise FetchError(f"cannot download {url}: {reason}") from None
            time.sleep(attempt)


def write_manifest(version: str, pom: Path, maven_args: list[str]) -> Path:
    """Resolve ``version`` with Maven (``pom``, ``maven_args``) and write its manifest beside this
    module: the developer's step that makes a release fetchable without Maven."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("Maven (mvn) is needed to write a manifest")
    listing = cache_root() / f"deps-{version}.txt"
    cmd = [mvn, "-q", "-B", "-f", str(pom), *maven_args, "dependency:list", "-DincludeScope=runtime",
           f"-DoutputFile={listing}", "-DoutputAbsoluteArtifactFilename=true"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    repo_root = Path.home() / ".m2" / "repository"
    jars = []
    for line in listing.read_text().splitlines():
        parts = line.strip().split(":")
        if len(parts) < 6 or parts[2] != "jar":
            continue
        local = Path(parts[-1])
        jars.append({"path": local.relative_to(repo_root).as_posix(), "size": local.stat().st_size,
                     "sha1": hashlib.sha1(local.read_bytes(), usedforsecurity=False).hexdigest()})
    jars.sort(key=lambda j: j["path"])
    out = manifest_path(version)
    out.write_text(json.dumps({"version": version, "jars": jars}, indent=1) + "\n")
    return out


if __name__ == "__main__":  # python -m kshare.embedded.distribution fetch 3.9.2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for v in sys.argv[2:]:
        print(fetch(v))

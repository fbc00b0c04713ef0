"""The console commands (``kshare consume``, ``kshare produce``, ``kshare groups``) when things go
wrong, run exactly as a user runs them: each command is a subprocess (``python -m kshare ...`` from
the repository root), the proxies are real ``kshare proxy`` processes in front of the session's
Tansu broker. No mocks; the one stand-in is a TCP listener that accepts connections and never
answers, the network's view of a hung broker (it also tells the test when librdkafka connected).

The promises kept here:

1. Ctrl-C (SIGINT) never prints a traceback and exits 130: while the servers are being reached
   (a dead port), while ``produce`` waits for its records to be delivered, while ``consume`` polls.
   (A KeyboardInterrupt raised inside librdkafka's callbacks used to end in "SystemError: <method
   'poll'> returned NULL without setting an exception".)
2. A proxy stopped under a running ``consume``: one ``Error:`` line naming the server, exit 1.
3. ``produce`` and ``consume`` to a port where nothing listens fail within seconds, in the words of
   ``kshare groups`` (``cannot reach HOST:PORT within 5000 ms (connection refused)``).
4. A TLS listener given a plaintext client: one line saying so and naming the option to use.
5. ``consume`` of a topic that does not exist yet says what ``latest`` means for it; with
   ``--from-beginning`` it reads the records written before its group first read the partition.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kshare.bench.procs import _die_with_parent, free_port
from tests.harness.cli import KSHARE, REPO, KshareProxy, one_line, run_kshare, user_env

log = logging.getLogger("kshare.tests.console")

pytestmark = pytest.mark.tansu


# ------------------------------------------------------------------------------------------------
# helpers


class Command:
    """``kshare ARGS`` running in the background; its output goes to files, read at any time."""

    def __init__(self, workdir: Path, *args: str, stdin: str | None = None) -> None:
        self.args = args
        name = f"{args[0]}-{uuid.uuid4().hex[:6]}"
        self.out_path, self.err_path = workdir / f"{name}.out", workdir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(_die_with_parent([*KSHARE, *args]), stdin=subprocess.PIPE, stdout=out,
                                            stderr=err, cwd=REPO, env=user_env(), text=True)
        self.started = time.monotonic()
        if stdin is not None:  # written, and kept open: the command waits for more input
            assert self.process.stdin is not None
            self.process.stdin.write(stdin)
            self.process.stdin.flush()

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def _until(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.process.poll() is not None:
                raise AssertionError(f"kshare {' '.join(self.args)} exited ({self.process.returncode}) before "
                                     f"{what}:\n{self.stdout()}\n{self.stderr()}")
            time.sleep(0.02)
        raise AssertionError(f"kshare {' '.join(self.args)}: not {what} in {timeout:.0f} s:\n{self.stderr()}")

    def wait_handling_signals(self, timeout: float = 30.0) -> None:
        """Until the command has set its signal handlers: Python catches SIGINT from the start, the
        command adds SIGTERM (a Ctrl-C during interpreter start-up is Python's own business)."""

        def caught_sigterm() -> bool:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
            return False

        self._until("handling signals", caught_sigterm, timeout)

    def wait_stderr(self, pattern: str, timeout: float = 30.0) -> None:
        self._until(f"printing {pattern!r}", lambda: re.search(pattern, self.stderr()) is not None, timeout)

    def wait_stdout_lines(self, count: int, timeout: float = 30.0) -> None:
        self._until(f"printing {count} lines", lambda: len(self.stdout().splitlines()) >= count, timeout)

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def finish(self, timeout: float) -> tuple[int, float]:
        """(exit status, seconds since start); killed (and the test failed) after ``timeout`` seconds."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            rc = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"kshare {' '.join(self.args)} still ran after {timeout:.0f} s:\n{self.stderr()}") \
                from None
        elapsed = time.monotonic() - self.started
        log.info("kshare %s -> %d in %.2f s\nstdout: %s\nstderr: %s", " ".join(self.args), rc, elapsed,
                 self.stdout(), self.stderr())
        return rc, elapsed


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text and "SystemError" not in text, text


def error_lines(stderr: str) -> list[str]:
    """stderr without consume's closing count."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("Processed a total of")]


class HungBroker:
    """A listener that accepts connections and never answers, as a broker that hangs; notes the
    client id of each connection's first request (``rdkafka``: librdkafka has connected)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.first_bytes: list[bytes] = []
        self._conns: list[socket.socket] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True, name="hung-broker").start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                data = conn.recv(200)
                with self._changed:
                    self.first_bytes.append(data)
                    self._changed.notify_all()

    def wait_for_client(self, client_id: bytes, timeout: float = 30.0) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: any(client_id in b for b in self.first_bytes), timeout):
                raise AssertionError(f"no {client_id!r} connection in {timeout:.0f} s: {self.first_bytes}")

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            conn.close()


@contextlib.contextmanager
def hung_broker() -> Iterator[HungBroker]:
    broker = HungBroker()
    try:
        yield broker
    finally:
        broker.close()


# ------------------------------------------------------------------------------------------------
# fixtures: one proxy (and one TLS proxy) for the module, on the session's Tansu broker


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console")


def _state_topic() -> str:
    # a state topic of its own: proxies sharing one (without an instance group) would each serve every group
    return f"__kshare_console_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def proxy(tansu, workdir: Path) -> Iterator[KshareProxy]:
    p = KshareProxy(workdir / "proxy", "--upstream", tansu.bootstrap, "--state-topic", _state_topic())
    with p.accepting(30):
        p.wait_loaded(30)
        yield p


@pytest.fixture(scope="module")
def tls_proxy(tansu, tls_material, workdir: Path) -> Iterator[KshareProxy]:
    p = KshareProxy(workdir / "tls-proxy", "--upstream", tansu.bootstrap, "--no-share-groups",
                    "--tls-cert", str(tls_material.server_cert), "--tls-key", str(tls_material.server_key))
    with p.accepting(30):
        yield p


# ------------------------------------------------------------------------------------------------
# 1. Ctrl-C


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_ctrl_c_while_reaching_a_dead_port(workdir: Path, command: str) -> None:
    cmd = Command(workdir, command, "--bootstrap-server", f"127.0.0.1:{free_port()}", "--topic", "jobs",
                  stdin="a record\n")
    cmd.wait_handling_signals()
    cmd.interrupt()
    rc, elapsed = cmd.finish(15)
    assert_no_traceback(cmd.stderr())
    assert rc == 130, (rc, cmd.stderr())
    assert cmd.stderr() == ""
    assert elapsed < 5, elapsed  # at once, not when the attempt to reach the port gives up


def test_ctrl_c_while_produce_waits_for_delivery(workdir: Path) -> None:
    with hung_broker() as broker:
        cmd = Command(workdir, "produce", "--bootstrap-server", broker.bootstrap, "--topic", "jobs",
                      stdin="first\nsecond\n")
        cmd.process.stdin.close()  # end of input: produce now waits for the deliveries
        cmd.process.stdin = None
        broker.wait_for_client(b"rdkafka")
        time.sleep(0.3)  # inside flush(), where the interrupt used to end in SystemError
        cmd.interrupt()
        rc, elapsed = cmd.finish(15)
    assert_no_traceback(cmd.stderr())
    assert rc == 130, (rc, cmd.stderr())
    assert one_line(cmd.stderr()) == "interrupted: 0 records delivered, 2 not"
    assert elapsed < 10, elapsed


def test_ctrl_c_while_consume_polls(workdir: Path) -> None:
    with hung_broker() as broker:
        cmd = Command(workdir, "consume", "--bootstrap-server", broker.bootstrap, "--topic", "jobs")
        broker.wait_for_client(b"rdkafka")
        time.sleep(0.3)
        cmd.interrupt()
        rc, elapsed = cmd.finish(20)
    assert_no_traceback(cmd.stderr())
    assert rc == 130, (rc, cmd.stderr())
    assert error_lines(cmd.stderr()) == [], cmd.stderr()
    assert "Processed a total of 0 messages" in cmd.stderr()


def test_ctrl_c_ends_produce_input(proxy: KshareProxy, workdir: Path) -> None:
    """Typing lines, then Ctrl-C instead of Ctrl-D: what was typed is delivered, then exit 130."""
    topic = f"typed-{uuid.uuid4().hex[:8]}"
    cmd = Command(workdir, "produce", "--bootstrap-server", proxy.bootstrap, "--topic", topic, stdin="typed\n")
    cmd.wait_handling_signals()
    time.sleep(1.0)  # the line is read and delivered; produce waits for the next one
    cmd.interrupt()
    rc, _ = cmd.finish(15)
    assert_no_traceback(cmd.stderr())
    assert rc == 130, (rc, cmd.stderr())
    assert one_line(cmd.stderr()) == "interrupted: 1 records delivered, 0 not"


# ------------------------------------------------------------------------------------------------
# 2. the proxy goes away under a running consume


def test_proxy_stopped_under_a_running_consume(tansu, workdir: Path) -> None:
    victim = KshareProxy(workdir / "victim", "--upstream", tansu.bootstrap, "--state-topic", _state_topic())
    with victim.accepting(30):
        victim.wait_loaded(30)
        topic = f"victim-{uuid.uuid4().hex[:8]}"
        proc = run_kshare("produce", "--bootstrap-server", victim.bootstrap, "--topic", topic, input="one\ntwo\n")
        assert proc.returncode == 0, proc.stderr
        cmd = Command(workdir, "consume", "--bootstrap-server", victim.bootstrap, "--topic", topic,
                      "--group", f"g-{uuid.uuid4().hex[:8]}", "--from-beginning")
        cmd.wait_stdout_lines(2)  # reading (and holding acquired records) when the proxy goes
        victim.stop()
        stopped = time.monotonic()
        rc, _ = cmd.finish(30)
        log.info("consume exited %.1f s after the proxy stopped", time.monotonic() - stopped)
    assert_no_traceback(cmd.stderr())
    assert rc == 1, (rc, cmd.stderr())
    assert sorted(cmd.stdout().split()) == ["one", "two"]
    lines = [line for line in error_lines(cmd.stderr()) if not line.startswith("NOTE ")]
    assert lines == [f"Error: lost the connection to the cluster: cannot reach {victim.bootstrap} within 5000 ms "
                     "(connection refused)"], cmd.stderr()


# ------------------------------------------------------------------------------------------------
# 3. nothing listens: within seconds, in kshare groups' words


def test_unreachable_port_fails_fast_in_the_words_of_groups(workdir: Path) -> None:
    port = free_port()
    bs = f"127.0.0.1:{port}"
    commands = [Command(workdir, "groups", "--bootstrap-server", bs, "--list"),
                Command(workdir, "produce", "--bootstrap-server", bs, "--topic", "jobs", stdin="a record\n"),
                Command(workdir, "consume", "--bootstrap-server", bs, "--topic", "jobs")]
    commands[1].process.stdin.close()
    commands[1].process.stdin = None
    expected = f"Error: cannot reach {bs} within 5000 ms (connection refused)"
    for cmd in commands:
        rc, elapsed = cmd.finish(30)
        assert_no_traceback(cmd.stderr())
        assert (rc, one_line(cmd.stderr())) == (1, expected), cmd.args
        assert elapsed < 10, (cmd.args, elapsed)


# ------------------------------------------------------------------------------------------------
# 4. a TLS listener given a plaintext client


def test_plaintext_client_at_a_tls_listener(tls_proxy: KshareProxy, tls_material, workdir: Path) -> None:
    bs = tls_proxy.bootstrap
    groups = Command(workdir, "groups", "--bootstrap-server", bs, "--list")
    produce = Command(workdir, "produce", "--bootstrap-server", bs, "--topic", "jobs", stdin="")
    consume = Command(workdir, "consume", "--bootstrap-server", bs, "--topic", "jobs")
    for cmd, option in ((groups, "--command-config FILE with"), (produce, "--producer-property"),
                        (consume, "--consumer-property")):
        rc, elapsed = cmd.finish(30)
        assert_no_traceback(cmd.stderr())
        line = one_line(cmd.stderr())
        assert rc == 1, (rc, line)
        assert line.startswith(f"Error: {bs} speaks TLS (it closed the plaintext connection without answering): "), line
        assert f"{option} security.protocol=SSL" in line, line
        assert elapsed < 10, (cmd.args, elapsed)

    # the option the message names works
    proc = run_kshare("produce", "--bootstrap-server", bs, "--topic", f"tls-{uuid.uuid4().hex[:8]}",
                      "--producer-property", "security.protocol=SSL",
                      "--producer-property", f"ssl.ca.location={tls_material.ca_cert}", input="over TLS\n")
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------------
# 5. a topic that does not exist yet: what latest means, and --from-beginning


def test_topic_created_after_consume_started(proxy: KshareProxy, workdir: Path) -> None:
    bs = proxy.bootstrap
    topic = f"later-{uuid.uuid4().hex[:8]}"
    latest = f"latest-{uuid.uuid4().hex[:8]}"
    proc = run_kshare("consume", "--bootstrap-server", bs, "--group", latest, "--topic", topic,
                      "--timeout-ms", "1000")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert f"WARNING topic '{topic}' does not exist: waiting for it to be created (Ctrl-C to stop)" in lines
    note = next(line for line in lines if line.startswith("NOTE "))
    assert f"share group '{latest}' starts at 'latest'" in note and "not delivered" in note, note
    assert "--from-beginning" in note and "share.auto.offset.reset=earliest" in note, note
    assert f"kshare groups --bootstrap-server {bs} --reset-offsets --group {latest} --topic {topic} --to-earliest" \
        in note, note

    group = f"earliest-{uuid.uuid4().hex[:8]}"
    cmd = Command(workdir, "consume", "--bootstrap-server", bs, "--group", group, "--topic", topic,
                  "--from-beginning", "--max-messages", "3", "--timeout-ms", "30000")
    cmd.wait_stderr("waiting for it to be created")
    proc = run_kshare("produce", "--bootstrap-server", bs, "--topic", topic, input="a\nb\nc\n")
    assert proc.returncode == 0, proc.stderr
    rc, _ = cmd.finish(45)
    assert rc == 0, cmd.stderr()
    assert sorted(cmd.stdout().split()) == ["a", "b", "c"], cmd.stderr()
    assert "starts at 'latest'" not in cmd.stderr()

    # a group that has read goes on from its offsets: --from-beginning says so and changes nothing
    proc = run_kshare("consume", "--bootstrap-server", bs, "--group", group, "--topic", topic, "--from-beginning",
                      "--timeout-ms", "1000")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert f"--from-beginning: share group '{group}' has start offsets already" in proc.stderr

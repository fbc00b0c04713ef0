"""``kshare groups`` / ``kshare consume`` / ``kshare produce`` on real groups.

* kshare (proxy + share-group service, in a thread) in front of Apache Kafka 3.9, with real
  confluent ``ShareConsumer`` members: every CLI action, its JSON output, refusals and errors.
* the same CLI against a native Apache Kafka 4.4 broker (it speaks only the Kafka protocol).
* Apache Kafka's own share-group tool (``ShareGroupCommand`` from kafka-tools 4.3.1; Maven Central
  has no kafka-tools 4.4.0) listing, describing and resetting groups THROUGH kshare.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient

from kshare.cli import main as kshare_main
from tests.harness import share
from tests.harness.brokers import BrokerError, ensure_kafka, free_port
from tests.harness.share import share_group

log = logging.getLogger("kshare.tests.cli")

SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
KAFKA_TOOLS_VERSION = "4.3.1"  # the newest kafka-tools on Maven Central (none for 4.4.0)


def _quiet() -> logging.Logger:
    return logging.getLogger("kshare.tests.cli.librdkafka")


# ------------------------------------------------------------------------------------------------
# kshare in a thread


kshare = share.kshare39  # kshare in front of the session's Apache Kafka 3.9, for the whole module


@pytest.fixture
def group() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------------------------
# running the CLI


def cli(*args: str, input: str | None = None) -> Result:
    result = CliRunner().invoke(kshare_main, list(args), input=input, catch_exceptions=False)
    log.info("kshare %s -> %s\n%s%s", " ".join(args), result.exit_code, result.stdout, result.stderr)
    return result


def groups(bootstrap: str, *args: str) -> Result:
    return cli("groups", "--bootstrap-server", bootstrap, "--timeout", "15000", *args)


def groups_ok(bootstrap: str, *args: str) -> str:
    r = groups(bootstrap, *args)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.stdout


def groups_json(bootstrap: str, *args: str) -> Any:
    return json.loads(groups_ok(bootstrap, *args, "--output", "json"))


def groups_err(bootstrap: str, *args: str, code: int = 1) -> str:
    r = groups(bootstrap, *args)
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    return r.stderr.strip()


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines() if line.strip()]


def offsets_of(bootstrap: str, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    [doc] = groups_json(bootstrap, "--describe", "--group", group)
    return {(o["topic"], o["partition"]): o for o in doc["offsets"]}


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ------------------------------------------------------------------------------------------------
# clients


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    client = AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet()})
    for fut in client.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = client.list_topics(name, timeout=10).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {name} has no leaders")


def produce(bootstrap: str, topic: str, records: Sequence[tuple[int, bytes, int | None]]) -> None:
    """(partition, value, timestamp ms or None) each."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "logger": _quiet(), "acks": "all"})
    errors: list[Any] = []
    for partition, value, ts in records:
        kw: dict[str, Any] = {"partition": partition, "value": value,
                              "on_delivery": lambda err, _m: errors.append(err) if err else None}
        if ts is not None:
            kw["timestamp"] = ts
        p.produce(topic, **kw)
    assert p.flush(30) == 0
    assert not errors, errors


class Member:
    """A confluent ShareConsumer (explicit mode, accepts everything) polling in a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str = "cli-test-member") -> None:
        self.consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                                       "share.acknowledgement.mode": "explicit", "logger": _quiet()})
        self.consumer.subscribe([topic])
        self.received: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = self.consumer.poll(0.3)
            except KafkaException as exc:
                log.info("poll: %s", exc)
                continue
            got = False
            for m in msgs:
                if m.error() is not None:
                    continue
                with self.lock:
                    self.received.append((m.partition(), m.offset(), m.value()))
                self.consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                got = True
            if got:
                self.consumer.commit_async()

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        try:
            self.consumer.commit_sync(10)
        except Exception:  # noqa: BLE001 - nothing pending
            pass
        self.consumer.close()


# checked every 0.3 s: most conditions here run the CLI
wait_until = partial(share.wait_until, interval=0.3)


def lag_zero(bootstrap: str, group: str, partitions: int) -> bool:
    offs = offsets_of(bootstrap, group)
    return len(offs) == partitions and all(o["lag"] == 0 for o in offs.values())


def members_of(bootstrap: str, group: str) -> list[dict[str, Any]]:
    [doc] = groups_json(bootstrap, "--describe", "--members", "--group", group)
    return doc["members"]


def only_member(bootstrap: str, group: str, *, partitions: int) -> dict[str, Any]:
    """The group's one member (as ``--describe --members`` shows it), once it is assigned ``partitions``."""
    wait_until(lambda: len(members_of(bootstrap, group)) == 1 and members_of(bootstrap, group)[0]["partitions"]
               == partitions, 60, "the member and its assignment")
    [m] = members_of(bootstrap, group)
    return m


def not_empty_message(group: str, n: int = 1) -> str:
    return f"Error: share group {group} is not empty ({n} member{'s' if n != 1 else ''}): stop its consumers first"


# ------------------------------------------------------------------------------------------------
# kshare in front of Apache Kafka 3.9


def test_list_describe_lag_and_refusals(kafka39, kshare, topic_name, group):
    ks = kshare.bootstrap
    create_topic(kafka39.bootstrap, topic_name, 3)
    share_group(ks, group)
    produce(ks, topic_name, [(i % 3, b"v%d" % i, None) for i in range(30)])

    # a reset before any consumer creates the group's offsets (as Kafka allows)
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-earliest", "--execute")
    assert plan == {"group": group, "executed": True, "offsets": [
        {"topic": topic_name, "partition": p, "start_offset": None, "new_offset": 0} for p in range(3)]}
    offs = offsets_of(ks, group)
    assert {k: (o["start_offset"], o["lag"]) for k, o in offs.items()} == {
        (topic_name, p): (0, 10) for p in range(3)}
    out = groups_ok(ks, "--describe", "--group", group)
    assert table(out)[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    assert [group, topic_name, "1", "0", "10"] in table(out)
    verbose = table(groups_ok(ks, "--describe", "--group", group, "--verbose"))
    assert verbose[0] == ["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"]
    assert group in groups_ok(ks, "--list").split()
    assert {"group": group, "state": "Empty"} in groups_json(ks, "--list", "--state")

    member = Member(ks, group, topic_name, client_id="cli-member-1")
    try:
        m = only_member(ks, group, partitions=3)
        assert m["client_id"] == "cli-member-1"
        assert m["assignment"] == {topic_name: [0, 1, 2]}
        assert m["subscribed_topics"] == [topic_name]
        assert m["member_epoch"] > 0
        rows = table(groups_ok(ks, "--describe", "--members", "--group", group))
        assert rows[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert rows[1][0] == group and rows[1][3:] == ["cli-member-1", "3", f"{topic_name}:0,1,2"]
        rows = table(groups_ok(ks, "--describe", "--members", "--verbose", "--group", group))
        assert "MEMBER-EPOCH" in rows[0]

        assert {"group": group, "state": "Stable"} in groups_json(ks, "--list", "--state", "stable")
        assert group not in [g["group"] for g in groups_json(ks, "--list", "--state", "Empty")]
        rows = table(groups_ok(ks, "--list", "--state", "Stable,Empty"))
        assert rows[0] == ["GROUP", "STATE"] and [group, "Stable"] in rows

        [state] = groups_json(ks, "--describe", "--state", "--group", group)
        assert state["state"] == "Stable" and state["members"] == 1 and state["group_epoch"] >= 1
        assert f"{state['coordinator']['host']}:{state['coordinator']['port']}" != ""
        out = groups_ok(ks, "--describe", "--state", "--verbose", "--group", group)
        assert "GROUP-EPOCH" in out and "ASSIGNMENT-EPOCH" in out and "Stable" in out

        # an active group is never reset, trimmed or deleted
        expected = not_empty_message(group)
        assert groups_err(ks, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-latest",
                          "--execute") == expected
        assert groups_err(ks, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest") == expected
        assert groups_err(ks, "--delete-offsets", "--group", group, "--topic", topic_name) == expected
        assert groups_err(ks, "--delete", "--group", group) == expected

        # lag falls to 0 once the member has caught up
        wait_until(lambda: member.count() >= 30 and lag_zero(ks, group, 3), 60, "lag 0")
        offs = offsets_of(ks, group)
        assert {k: o["start_offset"] for k, o in offs.items()} == {(topic_name, p): 10 for p in range(3)}
    finally:
        member.close()
    wait_until(lambda: groups_json(ks, "--describe", "--state", "--group", group)[0]["state"] == "Empty", 30,
               "the group to empty")
    r = groups(ks, "--describe", "--members", "--group", group)
    assert r.exit_code == 0 and r.stdout == "" and "has no active members" in r.stderr
    assert groups_json(ks, "--describe", "--members", "--group", group) == [
        {"group": group, "state": "Empty", "members": []}]


def test_reset_to_datetime_delete_offsets_and_delete(kafka39, kshare, topic_name, group):
    ks = kshare.bootstrap
    create_topic(kafka39.bootstrap, topic_name, 2)
    share_group(ks, group)
    t0 = (int(time.time()) - 3600) * 1000
    produce(ks, topic_name, [(p, b"p%d-%d" % (p, i), t0 + i * 1000) for p in range(2) for i in range(20)])

    member = Member(ks, group, topic_name)
    try:
        wait_until(lambda: member.count() >= 40 and lag_zero(ks, group, 2), 60, "everything consumed")
    finally:
        member.close()
    assert {k: o["start_offset"] for k, o in offsets_of(ks, group).items()} == {
        (topic_name, 0): 20, (topic_name, 1): 20}

    # dry run (the default): the plan, nothing changed
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-datetime", iso(t0 + 10_000))
    assert plan["executed"] is False
    assert [(o["partition"], o["start_offset"], o["new_offset"]) for o in plan["offsets"]] == [(0, 20, 10), (1, 20, 10)]
    assert all(o["start_offset"] == 20 for o in offsets_of(ks, group).values())
    r = groups(ks, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-datetime", iso(t0 + 10_000))
    assert table(r.stdout)[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "NEW-OFFSET"]
    assert [group, topic_name, "0", "20", "10"] in table(r.stdout) and "dry run" in r.stderr
    # the first record AT OR AFTER the time: between two records -> the later one; past the end -> the end
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--topic", f"{topic_name}:1", "--to-datetime",
                       iso(t0 + 10_500))
    assert [(o["partition"], o["new_offset"]) for o in plan["offsets"]] == [(1, 11)]
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--all-topics", "--to-datetime",
                       iso(t0 + 3_600_000))
    assert [o["new_offset"] for o in plan["offsets"]] == [20, 20]
    # --to-offset stays inside the partition; --to-earliest / --to-latest
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--all-topics", "--to-offset", "999")
    assert [o["new_offset"] for o in plan["offsets"]] == [20, 20]
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest")
    assert [o["new_offset"] for o in plan["offsets"]] == [0, 0]
    plan = groups_json(ks, "--reset-offsets", "--group", group, "--all-topics", "--to-latest", "--dry-run")
    assert [o["new_offset"] for o in plan["offsets"]] == [20, 20] and plan["executed"] is False

    # execute on partition 0 only: consumption restarts at the first record at or after the time
    groups_ok(ks, "--reset-offsets", "--group", group, "--topic", f"{topic_name}:0", "--to-datetime",
              iso(t0 + 12_000), "--execute")
    offs = offsets_of(ks, group)
    assert (offs[(topic_name, 0)]["start_offset"], offs[(topic_name, 0)]["lag"]) == (12, 8)
    assert (offs[(topic_name, 1)]["start_offset"], offs[(topic_name, 1)]["lag"]) == (20, 0)
    groups_ok(ks, "--reset-offsets", "--group", group, "--topic", f"{topic_name}:1", "--to-offset", "15", "--execute")
    assert offsets_of(ks, group)[(topic_name, 1)]["start_offset"] == 15
    member = Member(ks, group, topic_name)
    try:
        wait_until(lambda: member.count() >= 13 and lag_zero(ks, group, 2), 60, "the reset records")
        time.sleep(1)
        assert sorted((p, o) for p, o, _ in member.received) == (
            [(0, o) for o in range(12, 20)] + [(1, o) for o in range(15, 20)])
    finally:
        member.close()

    # --delete-offsets: the group forgets the topic; the next member starts at the reset policy (earliest)
    out = groups_json(ks, "--delete-offsets", "--group", group, "--topic", topic_name)
    assert out == {"group": group, "topics": [{"topic": topic_name, "error": None}]}
    r = groups(ks, "--describe", "--group", group)
    assert r.exit_code == 0 and "has no offset information" in r.stderr
    assert groups_json(ks, "--describe", "--group", group) == [{"group": group, "state": "Empty", "offsets": []}]
    member = Member(ks, group, topic_name)
    try:
        wait_until(lambda: member.count() >= 40 and lag_zero(ks, group, 2), 60, "everything again")
        assert sorted((p, o) for p, o, _ in member.received) == [(p, o) for p in range(2) for o in range(20)]
    finally:
        member.close()
    wait_until(lambda: groups_json(ks, "--describe", "--state", "--group", group)[0]["state"] == "Empty", 30,
               "the group to empty")
    rows = table(groups_ok(ks, "--delete-offsets", "--group", group, "--topic", topic_name))
    assert rows == [["TOPIC", "STATUS"], [topic_name, "Successful"]]

    # --delete
    assert groups_ok(ks, "--delete", "--group", group).strip() == (
        f"Deletion of requested share groups ('{group}') was successful.")
    assert group not in groups_ok(ks, "--list").split()
    assert groups_err(ks, "--describe", "--group", group) == f"Error: group {group} does not exist"


def test_errors(kafka39, kshare, topic_name):
    ks = kshare.bootstrap
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    expected = f"Error: group {missing} does not exist"
    assert groups_err(ks, "--describe", "--group", missing) == expected
    assert groups_err(ks, "--describe", "--members", "--group", missing) == expected
    assert groups_err(ks, "--delete", "--group", missing) == expected
    assert groups_err(ks, "--delete-offsets", "--group", missing, "--topic", "t") == expected
    assert groups_err(ks, "--reset-offsets", "--group", missing, "--all-topics", "--to-earliest") == expected
    assert groups_err(ks, "--reset-offsets", "--group", missing, "--topic", f"no-such-{topic_name}",
                      "--to-earliest") == f"Error: topic no-such-{topic_name} does not exist"
    create_topic(kafka39.bootstrap, topic_name, 2)
    assert groups_err(ks, "--reset-offsets", "--group", missing, "--topic", f"{topic_name}:0,7",
                      "--to-earliest") == f"Error: topic {topic_name} has no partition 7 (it has 2)"
    # a plain Kafka 3.9 broker has no share-group APIs: said plainly
    err = groups_err(kafka39.bootstrap, "--describe", "--group", missing)
    assert err.startswith("Error: ") and "does not support ShareGroupDescribe" in err

    # usage errors exit 2
    for args, text in [
        ((), "exactly one action"),
        (("--list", "--describe"), "exactly one action"),
        (("--list", "--members"), "--describe"),
        (("--describe",), "--group"),
        (("--reset-offsets", "--group", "g", "--topic", "t"), "--to-earliest"),
        (("--reset-offsets", "--group", "g", "--to-latest"), "--all-topics"),
        (("--reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--dry-run", "--execute"), "exclusive"),
        (("--reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "yesterday"), "--to-datetime"),
        (("--delete-offsets", "--group", "g"), "--topic"),
        (("--list", "--state", "Rebalancing"), "Valid states"),
    ]:
        assert text in groups_err(ks, *args, code=2), args

    # --command-config: client.id and PLAINTEXT are fine, unknown or incomplete settings are refused plainly
    cfg = Path(os.environ.get("PYTEST_TMPDIR", "/tmp")) / f"kshare-cli-{uuid.uuid4().hex[:6]}.properties"
    try:
        cfg.write_text("# admin settings\nclient.id = cli-admin\nsecurity.protocol=PLAINTEXT\n")
        groups_ok(ks, "--list", "--command-config", str(cfg))
        cfg.write_text("client.id=x\nssl.truststore.location=/x.jks\n")
        err = groups_err(ks, "--list", "--command-config", str(cfg))
        assert err.startswith("Error: --command-config") and "unsupported property ssl.truststore.location" in err
        cfg.write_text("security.protocol=SASL_SSL\n")
        assert "PLAIN needs sasl.username and sasl.password" in groups_err(ks, "--list", "--command-config", str(cfg))
        cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\n")
        assert "sasl.mechanism=GSSAPI is not supported" in groups_err(ks, "--list", "--command-config", str(cfg))
        cfg.write_text("security.protocol=TLS\n")
        assert "security.protocol=TLS is not one of" in groups_err(ks, "--list", "--command-config", str(cfg))
    finally:
        cfg.unlink(missing_ok=True)

    # an unreachable server: a one-line error within --timeout, through the real console script
    port = free_port()
    kshare_bin = shutil.which("kshare", path=str(Path(sys.executable).parent)) or "kshare"
    t = time.monotonic()
    proc = subprocess.run([kshare_bin, "groups", "--bootstrap-server", f"127.0.0.1:{port}", "--list",
                           "--timeout", "700"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == f"Error: cannot reach 127.0.0.1:{port} within 700 ms (connection refused)"
    assert time.monotonic() - t < 15


def test_progress_on_a_large_reset(kafka39, kshare, topic_name, group):
    ks = kshare.bootstrap
    create_topic(kafka39.bootstrap, topic_name, 120)
    r = groups(ks, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-latest", "--execute",
               "--output", "json")
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout)["offsets"]) == 120
    assert f"resetting {group}" in r.stderr and "240/240" in r.stderr  # lookups + writes, on stderr
    assert len(offsets_of(ks, group)) == 120
    r = groups(ks, "--reset-offsets", "--group", group, "--topic", f"{topic_name}:0,1", "--to-earliest", "--execute")
    assert r.exit_code == 0 and "resetting" not in r.stderr  # small and not a TTY: no bar


def test_console_produce_and_consume(kafka39, kshare, topic_name, group):
    ks = kshare.bootstrap
    create_topic(kafka39.bootstrap, topic_name, 1)
    share_group(ks, group)
    r = cli("produce", "--bootstrap-server", ks, "--topic", topic_name, "--key-separator", ":",
            input="k1:hello\nk2:world\nk3:again\n")
    assert r.exit_code == 0, r.stderr

    base = ("consume", "--bootstrap-server", ks, "--group", group, "--topic", topic_name)
    r = cli(*base, "--max-messages", "2", "--ack", "release", "--print-partition", "--print-offset",
            "--print-delivery-count", "--print-key", "--timeout-ms", "30000")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["Partition:0\tOffset:0\tDeliveryCount:1\tk1\thello",
                                     "Partition:0\tOffset:1\tDeliveryCount:1\tk2\tworld"]
    assert "Processed a total of 2 messages" in r.stderr and "Preview" not in r.stderr

    # released records come back (delivery count 2); reject archives them
    r = cli(*base, "--max-messages", "3", "--ack", "reject", "--print-delivery-count", "--print-key",
            "--key-separator", "=", "--timeout-ms", "30000")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["DeliveryCount:2\tk1=hello", "DeliveryCount:2\tk2=world"]
    assert lines[2].endswith("\tk3=again")
    # the acknowledgements of the last poll go out as the consumer closes: settled moments later
    wait_until(lambda: lag_zero(ks, group, 1), 15, "lag 0 after the rejections")

    # implicit acknowledgement (no --ack): values only, accepted when the consumer leaves
    r = cli("produce", "--bootstrap-server", ks, "--topic", topic_name, input="plain-1\nplain-2\n")
    assert r.exit_code == 0, r.stderr
    r = cli(*base, "--timeout-ms", "8000")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["plain-1", "plain-2"], (r.stdout, r.stderr)
    wait_until(lambda: lag_zero(ks, group, 1), 15, "lag 0 after the implicit acknowledgements")
    assert offsets_of(ks, group)[(topic_name, 0)] == {"topic": topic_name, "partition": 0, "start_offset": 5,
                                                       "leader_epoch": 0, "lag": 0}
    r = cli(*base, "--timeout-ms", "3000")
    assert r.exit_code == 0 and r.stdout == "" and "Processed a total of 0 messages" in r.stderr

    r = cli("produce", "--bootstrap-server", ks, "--topic", topic_name, "--key-separator", ":", input="nokey\n")
    assert r.exit_code == 1 and "line 1 has no key separator" in r.stderr


# ------------------------------------------------------------------------------------------------
# native Apache Kafka 4.4


def test_native_kafka4(kafka4, topic_name, group):
    k4 = kafka4.bootstrap
    create_topic(k4, topic_name, 2)
    share_group(k4, group)
    t0 = (int(time.time()) - 3600) * 1000
    produce(k4, topic_name, [(p, b"p%d-%d" % (p, i), t0 + i * 1000) for p in range(2) for i in range(10)])
    assert group not in groups_ok(k4, "--list").split()

    plan = groups_json(k4, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-earliest", "--execute")
    assert [(o["partition"], o["new_offset"]) for o in plan["offsets"]] == [(0, 0), (1, 0)]
    offs = offsets_of(k4, group)
    assert {k: (o["start_offset"], o["lag"]) for k, o in offs.items()} == {
        (topic_name, 0): (0, 10), (topic_name, 1): (0, 10)}
    assert {"group": group, "state": "Empty"} in groups_json(k4, "--list", "--state")

    member = Member(k4, group, topic_name, client_id="native-member")
    try:
        m = only_member(k4, group, partitions=2)
        assert m["client_id"] == "native-member" and m["assignment"] == {topic_name: [0, 1]}
        assert {"group": group, "state": "Stable"} in groups_json(k4, "--list", "--state", "Stable")
        [state] = groups_json(k4, "--describe", "--state", "--group", group)
        assert state["state"] == "Stable" and state["members"] == 1
        assert f"{state['coordinator']['host']}:{state['coordinator']['port']}" == k4
        assert groups_err(k4, "--reset-offsets", "--group", group, "--all-topics", "--to-latest",
                          "--execute") == not_empty_message(group)
        wait_until(lambda: member.count() >= 20 and lag_zero(k4, group, 2), 60, "lag 0")
    finally:
        member.close()
    wait_until(lambda: groups_json(k4, "--describe", "--state", "--group", group)[0]["state"] == "Empty", 60,
               "the group to empty")

    groups_ok(k4, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-datetime", iso(t0 + 4_500),
              "--execute")
    offs = offsets_of(k4, group)
    assert {k: (o["start_offset"], o["lag"]) for k, o in offs.items()} == {
        (topic_name, 0): (5, 5), (topic_name, 1): (5, 5)}
    rows = table(groups_ok(k4, "--describe", "--group", group))
    assert [group, topic_name, "0", "5", "5"] in rows

    assert groups_json(k4, "--delete-offsets", "--group", group, "--topic", topic_name)["topics"] == [
        {"topic": topic_name, "error": None}]
    assert offsets_of(k4, group) == {}
    groups_ok(k4, "--delete", "--group", group)
    assert group not in groups_ok(k4, "--list").split()
    assert groups_err(k4, "--describe", "--group", group) == f"Error: group {group} does not exist"

    # a classic consumer group of the same cluster is not taken for a share group
    from confluent_kafka import Consumer, TopicPartition

    classic = f"classic-{group}"
    c = Consumer({"bootstrap.servers": k4, "group.id": classic, "logger": _quiet()})
    try:
        c.commit(offsets=[TopicPartition(topic_name, 0, 3)], asynchronous=False)
    finally:
        c.close()
    assert groups_err(k4, "--describe", "--group", classic) == f"Error: group {classic} is not a share group"
    assert classic not in groups_ok(k4, "--list").split()


# ------------------------------------------------------------------------------------------------
# Apache Kafka's ShareGroupCommand through kshare


@pytest.fixture(scope="module")
def kafka_tools() -> Path:
    try:
        libs = ensure_kafka(KAFKA_TOOLS_VERSION)
    except BrokerError as exc:
        pytest.skip(f"kafka-tools {KAFKA_TOOLS_VERSION} not available: {exc}")
    if not list(libs.glob("kafka-tools-*.jar")):
        pytest.skip(f"no kafka-tools jar in {libs}")
    return libs


def share_group_command(libs: Path, bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    from tests.harness.brokers import _java

    cmd = [_java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{libs}/*",
           SHARE_GROUP_COMMAND, "--bootstrap-server", bootstrap, "--timeout", "20000", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log.info("ShareGroupCommand %s -> %d\n%s%s", " ".join(args), proc.returncode, proc.stdout, proc.stderr)
    return proc


def test_kafka_share_group_command_through_kshare(kafka39, kshare, kafka_tools, topic_name, group):
    ks = kshare.bootstrap
    create_topic(kafka39.bootstrap, topic_name, 2)
    share_group(ks, group)
    produce(ks, topic_name, [(p, b"v%d" % i, None) for p in range(2) for i in range(8)])

    member = Member(ks, group, topic_name, client_id="java-tool-member")
    try:
        wait_until(lambda: member.count() >= 16 and lag_zero(ks, group, 2)
                   and len(members_of(ks, group)) == 1, 60, "the member to catch up")
        member_id = members_of(ks, group)[0]["member_id"]
        with ThreadPoolExecutor(3) as pool:  # one JVM start each: run them side by side
            listed = pool.submit(share_group_command, kafka_tools, ks, "--list", "--state")
            members = pool.submit(share_group_command, kafka_tools, ks, "--describe", "--group", group, "--members")
            refused = pool.submit(share_group_command, kafka_tools, ks, "--reset-offsets", "--group", group,
                                  "--topic", topic_name, "--to-earliest", "--execute")
        out = listed.result()
        assert out.returncode == 0, out.stderr
        assert [group, "Stable"] in table(out.stdout)
        out = members.result()
        assert out.returncode == 0, out.stderr
        rows = table(out.stdout)
        assert rows[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert rows[1] == [group, member_id, "/127.0.0.1", "java-tool-member", "2", f"{topic_name}:0,1"]
        out = refused.result()
        assert out.returncode == 1 and f"Share group '{group}' is not empty." in out.stdout + out.stderr
    finally:
        member.close()
    wait_until(lambda: groups_json(ks, "--describe", "--state", "--group", group)[0]["state"] == "Empty", 30,
               "the group to empty")

    out = share_group_command(kafka_tools, ks, "--reset-offsets", "--group", group, "--topic", topic_name,
                              "--to-earliest", "--execute")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = table(out.stdout)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    assert sorted(rows[1:]) == [[group, topic_name, "0", "0"], [group, topic_name, "1", "0"]]
    assert {k: (o["start_offset"], o["lag"]) for k, o in offsets_of(ks, group).items()} == {
        (topic_name, 0): (0, 8), (topic_name, 1): (0, 8)}

    out = share_group_command(kafka_tools, ks, "--describe", "--group", group)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = table(out.stdout)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    assert sorted(rows[1:]) == [[group, topic_name, "0", "0", "8"], [group, topic_name, "1", "0", "8"]]

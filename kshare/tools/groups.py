"""``kshare groups``: list, describe, reset and delete share groups, like kafka-share-groups.sh.

Everything goes over the Kafka protocol (see :mod:`kshare.clients.admin`), so the command
works against kshare and against a native Apache Kafka 4.x cluster alike.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click

from ..clients.admin import (
    EARLIEST,
    GROUP_STATES,
    LATEST,
    AdminError,
    GroupDescription,
    GroupNotEmpty,
    GroupNotFound,
    PartitionOffset,
    ShareGroupAdmin,
)
from ..clients.settings import load_command_config, parse_bootstrap

MISSING = "-"
ALTER_CHUNK = 100  # partitions per AlterShareGroupOffsets request (progress granularity)
PROGRESS_MIN_PARTITIONS = 100  # a progress bar off a TTY only for resets this large


# ------------------------------------------------------------------------------------------------
# output


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def print_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """An aligned table (rich; bold headers on a terminal, plain text otherwise)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1), header_style="bold",
                  show_header=True)
    for col in columns:
        table.add_column(col, no_wrap=True, overflow="fold")
    for row in rows:
        table.add_row(*(MISSING if v is None else str(v) for v in row))
    if _stdout_is_tty():
        Console(highlight=False, soft_wrap=True).print(table)
        return
    buf = io.StringIO()
    Console(file=buf, width=100_000, highlight=False, color_system=None, force_terminal=False).print(table)
    click.echo("\n".join(line.rstrip() for line in buf.getvalue().splitlines()))


def print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2))


def note(message: str) -> None:
    """An informational line on stderr (kept out of the tables and the JSON on stdout)."""
    click.echo(message, err=True)


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool):
    """A rich progress bar on stderr; yields ``advance(n)`` (a no-op when disabled)."""
    if not enabled or total <= 0:
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=console.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


# ------------------------------------------------------------------------------------------------
# argument parsing


@dataclass(slots=True)
class TopicSpec:
    topic: str
    partitions: list[int] | None  # None: every partition


def parse_topic_spec(value: str) -> TopicSpec:
    """``T`` or ``T:0,1,5``."""
    topic, sep, parts = value.partition(":")
    if not topic:
        raise click.BadParameter(f"'{value}' has no topic name", param_hint="--topic")
    if not sep:
        return TopicSpec(topic, None)
    try:
        partitions = sorted({int(p) for p in parts.split(",") if p.strip()})
    except ValueError:
        raise click.BadParameter(f"'{value}': partitions must be integers (T:0,1,2)", param_hint="--topic") from None
    if not partitions or any(p < 0 for p in partitions):
        raise click.BadParameter(f"'{value}': give partitions as T:0,1,2", param_hint="--topic")
    return TopicSpec(topic, partitions)


def parse_datetime(value: str) -> int:
    """``YYYY-MM-DDTHH:mm:SS[.sss][Z|±hh:mm]`` (local time without a zone) -> epoch milliseconds."""
    text = value.strip()
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"'{value}' is not a date-time like 2024-01-31T23:59:00.000 "
                                 f"(optionally ending in Z or +hh:mm)", param_hint="--to-datetime") from None
    if "T" not in text:
        raise click.BadParameter(f"'{value}' has no time: use YYYY-MM-DDTHH:mm:SS.sss",
                                 param_hint="--to-datetime")
    if dt.tzinfo is None:
        dt = dt.astimezone()  # local time, as Kafka's tool
    return int(dt.timestamp() * 1000)


def parse_states(value: str) -> list[str]:
    states = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        match = [s for s in GROUP_STATES if s.lower() == item.lower()]
        if not match:
            raise click.BadParameter(f"invalid state '{item}'. Valid states are: {', '.join(GROUP_STATES)}",
                                     param_hint="--state")
        states.append(match[0])
    return states


# ------------------------------------------------------------------------------------------------
# the command


ACTIONS = ("list", "describe", "reset_offsets", "delete_offsets", "delete")
ACTION_FLAGS = "--list, --describe, --delete, --reset-offsets, --delete-offsets"


@click.command("groups", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]",
              help="REQUIRED: the server(s) to connect to (kshare or a Kafka 4.x cluster).")
@click.option("--command-config", type=click.Path(dir_okay=False), metavar="FILE",
              help="Client properties file: client.id, request.timeout.ms, security.protocol (PLAINTEXT, SSL, "
                   "SASL_PLAINTEXT, SASL_SSL), sasl.mechanism (PLAIN, SCRAM-SHA-256/512), sasl.username, "
                   "sasl.password or sasl.jaas.config, ssl.ca.location, ssl.certificate.location, ssl.key.location.")
@click.option("--list", "list_", is_flag=True, help="List all share groups.")
@click.option("--describe", is_flag=True,
              help="Describe share groups: offsets and lag (default), --members, --configs or --state.")
@click.option("--reset-offsets", is_flag=True,
              help="Reset the start offsets of one share group (its consumers must be stopped).")
@click.option("--delete-offsets", is_flag=True,
              help="Delete a share group's offsets for the --topic(s) (consumption of them starts over).")
@click.option("--delete", is_flag=True, help="Delete share groups (empty ones only).")
@click.option("--group", "groups_", multiple=True, metavar="GROUP", help="The share group to act on (repeatable).")
@click.option("--all-groups", is_flag=True, help="Apply --describe or --delete to every share group.")
@click.option("--state", is_flag=False, flag_value="", default=None, metavar="[STATE,...]",
              help="With --list: show states, optionally only groups in these states (Empty, Stable). "
                   "With --describe: the group state.")
@click.option("--members", is_flag=True, help="With --describe: the members of the group.")
@click.option("--offsets", is_flag=True, help="With --describe: partitions with start offset and lag (default).")
@click.option("--configs", is_flag=True,
              help="With --describe: the group's configs (kshare's own, such as kshare.share.ordering, included).")
@click.option("--verbose", is_flag=True, help="With --describe: more columns (epochs).")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P]",
              help="Topic (optionally only some partitions) to reset, or whose offsets to delete (repeatable).")
@click.option("--all-topics", is_flag=True, help="With --reset-offsets: every topic the group has offsets for.")
@click.option("--to-earliest", is_flag=True, help="Reset to the earliest offset.")
@click.option("--to-latest", is_flag=True, help="Reset to the latest offset (the end of the partition).")
@click.option("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss",
              help="Reset to the first record at or after this time (local time unless it ends in Z/+hh:mm).")
@click.option("--to-offset", type=int, metavar="N", help="Reset to offset N (kept within the partition).")
@click.option("--dry-run", is_flag=True, help="With --reset-offsets: only show the new offsets (the default).")
@click.option("--execute", is_flag=True, help="With --reset-offsets: apply the new offsets.")
@click.option("--timeout", "timeout_ms", type=click.IntRange(min=1), default=5000, show_default=True, metavar="MS",
              help="Timeout of each admin call in milliseconds (also bounds reaching the server).")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Aligned tables, or one JSON document for scripts.")
def groups(bootstrap_server: str, command_config: str | None, list_: bool, describe: bool, reset_offsets: bool,
           delete_offsets: bool, delete: bool, groups_: tuple[str, ...], all_groups: bool, state: str | None,
           members: bool, offsets: bool, configs: bool, verbose: bool, topics: tuple[str, ...], all_topics: bool,
           to_earliest: bool, to_latest: bool, to_datetime: str | None, to_offset: int | None, dry_run: bool,
           execute: bool, timeout_ms: int, output: str) -> None:
    """List, describe, reset and delete share groups (like kafka-share-groups.sh).

    \b
    Examples:
      kshare groups --bootstrap-server localhost:9192 --list --state
      kshare groups --bootstrap-server localhost:9192 --describe --group G --members
      kshare groups --bootstrap-server localhost:9192 --describe --group G --configs
      kshare groups --bootstrap-server localhost:9192 --reset-offsets --group G --topic T --to-earliest --execute
      kshare groups --bootstrap-server localhost:9192 --delete-offsets --group G --topic T
      kshare groups --bootstrap-server localhost:9192 --delete --group G
    """
    chosen = [a for a, on in zip(ACTIONS, (list_, describe, reset_offsets, delete_offsets, delete), strict=True) if on]
    if len(chosen) != 1:
        raise click.UsageError(f"Command must include exactly one action: {ACTION_FLAGS}.")
    action = chosen[0]
    json_out = output == "json"

    def only_with(flag_on: bool, name: str, allowed: str) -> None:
        if flag_on:
            raise click.UsageError(f"Option {name} can only be used with {allowed}.")

    describe_views = [n for n, on in (("--members", members), ("--offsets", offsets), ("--configs", configs),
                                      ("--state", state is not None and action == "describe")) if on]
    only_with(action != "describe" and (members or offsets or configs or verbose),
              "--members/--offsets/--configs/--verbose", "--describe")
    only_with(action not in ("list", "describe") and state is not None, "--state", "--list or --describe")
    only_with(action != "reset_offsets" and (all_topics or to_earliest or to_latest or dry_run or execute
                                             or to_datetime is not None or to_offset is not None),
              "--all-topics/--to-*/--dry-run/--execute", "--reset-offsets")
    only_with(action not in ("reset_offsets", "delete_offsets") and bool(topics), "--topic",
              "--reset-offsets or --delete-offsets")
    only_with(action not in ("describe", "delete") and all_groups, "--all-groups", "--describe or --delete")
    if action == "list" and groups_:
        raise click.UsageError("Option --group cannot be used with --list.")
    if len(describe_views) > 1:
        raise click.UsageError("Options --members, --offsets, --configs and --state are mutually exclusive.")
    if action == "describe" and state:
        raise click.UsageError("With --describe, --state takes no value.")
    if action in ("describe", "delete") and not groups_ and not all_groups:
        raise click.UsageError(f"Option --{action} needs --group or --all-groups.")
    if action in ("describe", "delete") and groups_ and all_groups:
        raise click.UsageError("Options --group and --all-groups are mutually exclusive.")
    if action in ("reset_offsets", "delete_offsets") and len(groups_) != 1:
        raise click.UsageError(f"Option --{action.replace('_', '-')} takes exactly one --group.")
    if action == "reset_offsets":
        scenarios = [on for on in (to_earliest, to_latest, to_datetime is not None, to_offset is not None) if on]
        if len(scenarios) != 1:
            raise click.UsageError("Option --reset-offsets needs exactly one of --to-earliest, --to-latest, "
                                   "--to-datetime, --to-offset.")
        if bool(topics) == all_topics:
            raise click.UsageError("Option --reset-offsets needs either --topic or --all-topics.")
        if dry_run and execute:
            raise click.UsageError("Options --dry-run and --execute are mutually exclusive.")
    if action == "delete_offsets" and not topics:
        raise click.UsageError("Option --delete-offsets needs at least one --topic.")
    topic_specs = [parse_topic_spec(t) for t in topics]
    if action == "delete_offsets" and any(s.partitions is not None for s in topic_specs):
        raise click.UsageError("Option --delete-offsets deletes whole topics: give --topic T without partitions.")
    states = parse_states(state) if action == "list" and state else []
    target: tuple[str, int] | None = None
    if action == "reset_offsets":
        if to_earliest:
            target = ("earliest", EARLIEST)
        elif to_latest:
            target = ("latest", LATEST)
        elif to_datetime is not None:
            target = ("datetime", parse_datetime(to_datetime))
        else:
            assert to_offset is not None
            if to_offset < 0:
                raise click.BadParameter("must be >= 0", param_hint="--to-offset")
            target = ("offset", to_offset)

    try:
        servers = parse_bootstrap(bootstrap_server)
        settings = load_command_config(command_config) if command_config else None
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    client_id = settings.client_id if settings else "kshare-groups"

    async def run() -> int:
        async with ShareGroupAdmin(servers, client_id=client_id, timeout_ms=timeout_ms,
                                   security=settings.security if settings else None) as admin:
            if action == "list":
                return await do_list(admin, states, show_state=state is not None, json_out=json_out)
            names = list(dict.fromkeys(groups_))
            if all_groups:
                names = [g.group_id for g in await admin.list_groups()]
            if action == "describe":
                view = describe_views[0] if describe_views else "--offsets"
                return await do_describe(admin, names, view, verbose=verbose, json_out=json_out)
            if action == "reset_offsets":
                assert target is not None
                return await do_reset(admin, names[0], topic_specs, all_topics, target, execute=execute,
                                      json_out=json_out)
            if action == "delete_offsets":
                return await do_delete_offsets(admin, names[0], [s.topic for s in topic_specs], json_out=json_out)
            return await do_delete(admin, names, json_out=json_out)

    try:
        code = asyncio.run(run())
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        raise click.Abort() from None
    if code:
        sys.exit(code)


# ------------------------------------------------------------------------------------------------
# --list


async def do_list(admin: ShareGroupAdmin, states: list[str], *, show_state: bool, json_out: bool) -> int:
    listed = await admin.list_groups(states)
    if json_out:
        print_json([{"group": g.group_id, "state": g.state} for g in listed])
    elif show_state:
        print_table(["GROUP", "STATE"], [(g.group_id, g.state) for g in listed])
    else:
        for g in listed:
            click.echo(g.group_id)
    return 0


# ------------------------------------------------------------------------------------------------
# --describe


def _assignment_text(assignment: dict[str, list[int]]) -> str:
    return ";".join(f"{t}:{','.join(str(p) for p in parts)}" for t, parts in sorted(assignment.items()))


def _coordinator_text(d: GroupDescription) -> str:
    return f"{d.coordinator.host}:{d.coordinator.port} ({d.coordinator.node_id})"


def _offset_doc(o: PartitionOffset) -> dict[str, Any]:
    doc: dict[str, Any] = {"topic": o.topic, "partition": o.partition, "start_offset": o.start_offset,
                           "leader_epoch": o.leader_epoch, "lag": o.lag}
    if o.error:
        doc["error"] = o.error
    return doc


def _member_doc(m) -> dict[str, Any]:
    return {"member_id": m.member_id, "client_id": m.client_id, "host": m.host, "rack": m.rack,
            "member_epoch": m.member_epoch, "partitions": m.partitions, "subscribed_topics": m.subscribed,
            "assignment": m.assignment}


def _group_doc(d: GroupDescription) -> dict[str, Any]:
    return {"group": d.group_id, "state": d.state, "group_epoch": d.group_epoch,
            "assignment_epoch": d.assignment_epoch, "assignor": d.assignor,
            "coordinator": {"id": d.coordinator.node_id, "host": d.coordinator.host, "port": d.coordinator.port},
            "members": len(d.members)}


async def do_describe(admin: ShareGroupAdmin, names: list[str], view: str, *, verbose: bool,
                      json_out: bool) -> int:
    descriptions = {name: await admin.describe_group(name) for name in sorted(names)}
    docs: list[dict[str, Any]] = []
    first = True

    def gap() -> None:
        nonlocal first
        if not first:
            click.echo()
        first = False

    for name, d in descriptions.items():
        if view == "--state":
            if json_out:
                docs.append(_group_doc(d))
                continue
            gap()
            if verbose:
                print_table(["GROUP", "COORDINATOR (ID)", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "#MEMBERS"],
                            [(name, _coordinator_text(d), d.state, d.group_epoch, d.assignment_epoch,
                              len(d.members))])
            else:
                print_table(["GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"],
                            [(name, _coordinator_text(d), d.state, len(d.members))])
        elif view == "--configs":
            rows = await admin.describe_configs(name)
            if json_out:
                docs.append({"group": name, "configs": [{"name": n, "value": v, "source": src}
                                                        for n, v, src in rows]})
                continue
            gap()
            print_table(["GROUP", "CONFIG", "VALUE", "SOURCE"], [(name, n, v, src) for n, v, src in rows])
        elif view == "--members":
            if json_out:
                docs.append({"group": name, "state": d.state, "members": [_member_doc(m) for m in d.members]})
                continue
            if not d.members:
                note(f"Share group '{name}' has no active members.")
                continue
            gap()
            if verbose:
                print_table(["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "MEMBER-EPOCH",
                             "ASSIGNMENT"],
                            [(name, m.member_id, m.host, m.client_id, m.partitions, m.member_epoch,
                              _assignment_text(m.assignment)) for m in d.members])
            else:
                print_table(["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"],
                            [(name, m.member_id, m.host, m.client_id, m.partitions, _assignment_text(m.assignment))
                             for m in d.members])
        else:
            offsets_ = await admin.describe_offsets(name)
            if json_out:
                docs.append({"group": name, "state": d.state, "offsets": [_offset_doc(o) for o in offsets_]})
                continue
            if not d.members:
                note(f"Share group '{name}' has no active members.")
            if not offsets_:
                note(f"Share group '{name}' has no offset information.")
                continue
            gap()
            if verbose:
                print_table(["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"],
                            [(name, o.topic, o.partition, o.leader_epoch, o.start_offset, o.lag) for o in offsets_])
            else:
                print_table(["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"],
                            [(name, o.topic, o.partition, o.start_offset, o.lag) for o in offsets_])
    if json_out:
        print_json(docs)
    return 0


# ------------------------------------------------------------------------------------------------
# --reset-offsets


async def _require_empty(admin: ShareGroupAdmin, group: str, *, must_exist: bool) -> GroupDescription | None:
    try:
        d = await admin.describe_group(group)
    except GroupNotFound:
        if must_exist:
            raise
        return None
    if d.members or d.state.lower() not in ("empty", "dead"):
        raise GroupNotEmpty(group, len(d.members))
    return d


async def _partitions_of(admin: ShareGroupAdmin, specs: list[TopicSpec]) -> list[tuple[str, int]]:
    await admin.refresh_metadata(sorted({s.topic for s in specs}))
    out: list[tuple[str, int]] = []
    for s in specs:
        meta = admin.topics.get(s.topic)
        if meta is None:
            raise AdminError(f"topic {s.topic} does not exist")
        if s.partitions is None:
            out.extend((s.topic, p) for p in meta.partitions)
            continue
        bad = [p for p in s.partitions if p not in meta.leaders]
        if bad:
            raise AdminError(f"topic {s.topic} has no partition {', '.join(map(str, bad))} "
                             f"(it has {len(meta.leaders)})")
        out.extend((s.topic, p) for p in s.partitions)
    return sorted(set(out))


async def do_reset(admin: ShareGroupAdmin, group: str, specs: list[TopicSpec], all_topics: bool,
                   target: tuple[str, int], *, execute: bool, json_out: bool) -> int:
    description = await _require_empty(admin, group, must_exist=all_topics)
    current: dict[tuple[str, int], int | None] = {}
    if description is not None:
        if all_topics:
            known = await admin.describe_offsets(group)
        else:
            wanted: dict[str, list[int]] = {}
            for tp in await _partitions_of(admin, specs):
                wanted.setdefault(tp[0], []).append(tp[1])
            known = await admin.describe_offsets(group, wanted)
        current = {(o.topic, o.partition): o.start_offset for o in known if o.error is None}
    if all_topics:
        partitions = sorted(current)
        await admin.refresh_metadata(sorted({t for t, _ in partitions}))
        partitions = [(t, p) for t, p in partitions if t in admin.topics]
    else:
        partitions = await _partitions_of(admin, specs)
    if not partitions:
        note(f"Share group '{group}' has no offsets to reset.")
        if json_out:
            print_json({"group": group, "executed": execute, "offsets": []})
        return 0

    kind, value = target
    lookups = 2 if kind in ("offset", "datetime") else 1
    steps = len(partitions) * (lookups + (1 if execute else 0))
    show = _stderr_is_tty() or len(partitions) >= PROGRESS_MIN_PARTITIONS
    failures: dict[tuple[str, int], str] = {}
    with progress_bar(steps, f"resetting {group}", enabled=show) as advance:
        if kind == "earliest":
            new = await admin.list_offsets(partitions, EARLIEST, advance)
        elif kind == "latest":
            new = await admin.list_offsets(partitions, LATEST, advance)
        elif kind == "datetime":
            by_time = await admin.list_offsets(partitions, value, advance)
            latest = await admin.list_offsets(partitions, LATEST, advance)
            new = {tp: (off if off >= 0 else latest[tp]) for tp, off in by_time.items()}
        else:
            earliest = await admin.list_offsets(partitions, EARLIEST, advance)
            latest = await admin.list_offsets(partitions, LATEST, advance)
            new = {tp: min(max(value, earliest[tp]), latest[tp]) for tp in partitions}
            clamped = [tp for tp in partitions if new[tp] != value]
            if clamped:
                note(f"--to-offset {value} is outside {len(clamped)} partition(s); "
                     f"using their nearest valid offset instead")
        if execute:
            for i in range(0, len(partitions), ALTER_CHUNK):
                chunk = {tp: new[tp] for tp in partitions[i:i + ALTER_CHUNK]}
                result = await admin.alter_offsets(group, chunk)
                failures.update({tp: err for tp, err in result.items() if err is not None})
                advance(len(chunk))

    rows = [(group, t, p, current.get((t, p)), new[(t, p)]) for t, p in partitions]
    if json_out:
        print_json({"group": group, "executed": execute, "offsets": [
            {"topic": t, "partition": p, "start_offset": cur, "new_offset": nw,
             **({"error": failures[(t, p)]} if (t, p) in failures else {})} for _, t, p, cur, nw in rows]})
    else:
        print_table(["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "NEW-OFFSET"], rows)
        if not execute:
            note("(dry run: nothing was changed; add --execute to apply these offsets)")
    for (t, p), err in sorted(failures.items()):
        click.echo(f"Error: resetting {t}-{p} failed: {err}", err=True)
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------------
# --delete-offsets


async def do_delete_offsets(admin: ShareGroupAdmin, group: str, topics: list[str], *, json_out: bool) -> int:
    await _require_empty(admin, group, must_exist=True)
    result = await admin.delete_offsets(group, list(dict.fromkeys(topics)))
    if json_out:
        print_json({"group": group, "topics": [{"topic": t, "error": err} for t, err in sorted(result.items())]})
    else:
        print_table(["TOPIC", "STATUS"], [(t, "Successful" if err is None else f"Error: {err}")
                                          for t, err in sorted(result.items())])
    return 1 if any(err is not None for err in result.values()) else 0


# ------------------------------------------------------------------------------------------------
# --delete


async def do_delete(admin: ShareGroupAdmin, names: list[str], *, json_out: bool) -> int:
    deleted: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            await _require_empty(admin, name, must_exist=True)
            await admin.delete_group(name)
            deleted.append(name)
        except (GroupNotFound, GroupNotEmpty) as exc:
            failed[name] = str(exc)
        except AdminError as exc:
            failed[name] = f"group {name}: {exc}"
    if json_out:
        print_json({"deleted": deleted, "failed": failed})
    elif deleted:
        click.echo("Deletion of requested share groups (" + ", ".join(f"'{g}'" for g in deleted)
                   + ") was successful.")
    for message in failed.values():
        click.echo(f"Error: {message}", err=True)
    return 1 if failed else 0


__all__ = ["groups"]

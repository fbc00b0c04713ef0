"""``host:port`` lists as the CLI and the configuration take them (the cluster's bootstrap servers).

Below every layer that needs it (``clients`` for bootstrap servers, ``proxy`` for its upstream,
``share`` for its probes of the cluster), so none of them imports another for a parser. Each
caller words its own errors (``not_hostport``, ``nothing``): the CLI's name its option.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def host_port(item: str) -> tuple[str, int] | None:
    """``"h1:9092"`` or ``"[::1]:9092"`` as (host, port); None when it is not HOST:PORT."""
    if item.startswith("["):
        host, sep, port = item[1:].partition("]:")
    else:
        host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


def _not_hostport(item: str) -> Exception:
    return ValueError(f"not a host:port: {item!r}")


def _nothing() -> Exception:
    return ValueError("no host:port given")


def parse_hostports(value: str | Iterable[str | tuple[str, int]], *,
                    not_hostport: Callable[[str], Exception] = _not_hostport,
                    nothing: Callable[[], Exception] = _nothing) -> list[tuple[str, int]]:
    """``"a:9092,b:9093"`` -> ``[("a", 9092), ("b", 9093)]``; IPv6 as ``[::1]:9092``. Also a list of
    such items, or of (host, port) pairs already parsed. Blank items are skipped; an item that is not
    HOST:PORT raises ``not_hostport(item)``, a list without any ``nothing()``."""
    items = value.split(",") if isinstance(value, str) else value
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append((str(item[0]), int(item[1])))
            continue
        item = item.strip()
        if not item:
            continue
        server = host_port(item)
        if server is None:
            raise not_hostport(item)
        out.append(server)
    if not out:
        raise nothing()
    return out


__all__ = ["host_port", "parse_hostports"]

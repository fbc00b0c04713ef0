"""``host:port`` lists as the CLI and the configuration take them (the cluster's bootstrap servers).

Below every layer that needs it (``proxy`` for its upstream, ``share`` for its probes of the
cluster), so none of them imports the other for a parser.
"""

from __future__ import annotations


def parse_hostports(text: str) -> list[tuple[str, int]]:
    """``"a:9092,b:9093"`` -> ``[("a", 9092), ("b", 9093)]``; IPv6 as ``[::1]:9092``."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            host, _, port = item[1:].partition("]:")
        else:
            host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not a host:port: {item!r}")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no host:port given")
    return out


__all__ = ["parse_hostports"]

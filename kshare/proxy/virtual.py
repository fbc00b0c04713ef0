"""The virtual cluster an instance group shows its clients.

Several proxies of one instance group are one cluster to a client: every proxy lists every proxy's
listeners in Metadata, each under a node id of its own, and names as a partition's leader (and a
group's coordinator) a listener of the proxy that owns it. A node id packs the proxy's slot and
the upstream broker the listener stands for::

    node id = slot * SLOT_STRIDE + upstream broker id

so slot 0's node ids are the cluster's own. Which proxy owns what is decided by the share layer
(``kshare.share.ownership``); it hands the proxy a :class:`ClusterView` on every change and the
response rewriters (``rewrite.py``) consult it. Without a view (one proxy) the cluster's node ids
are shown unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

SLOT_STRIDE = 1 << 20
MAX_SLOTS = (1 << 31) // SLOT_STRIDE  # 2048


def virtual_node(slot: int, broker_id: int) -> int:
    if not 0 <= broker_id < SLOT_STRIDE:
        raise ValueError(f"broker id {broker_id} is outside 0..{SLOT_STRIDE - 1}: an instance group cannot front it")
    return slot * SLOT_STRIDE + broker_id


def split_node(node_id: int) -> tuple[int, int]:
    """(slot, upstream broker id) of a virtual node id."""
    return divmod(node_id, SLOT_STRIDE)


@dataclass(frozen=True)
class Peer:
    """One proxy of the group as clients reach it."""

    slot: int
    host: str
    broker_ports: Mapping[int, int] = field(default_factory=dict)  # upstream broker id -> listener port
    broker_port_base: int = 0  # > 0: broker b is also on base + b (brokers that appeared after it joined)

    def port_for(self, broker_id: int) -> int | None:
        port = self.broker_ports.get(broker_id)
        if port is None and self.broker_port_base > 0:
            port = self.broker_port_base + broker_id
        return port


def _nobody(*_: object) -> int | None:
    return None


@dataclass(frozen=True)
class ClusterView:
    """This proxy's slot, every proxy of the group, and who owns what (slots; None: nobody)."""

    me: int
    peers: Mapping[int, Peer]  # by slot
    partition_owner: Callable[[bytes, int], int | None] = _nobody
    group_owner: Callable[[str], int | None] = _nobody
    epoch: int = 0

    def slot_for(self, owner: int | None, broker_id: int) -> int:
        """The owner's slot if it can serve ``broker_id``, else this proxy's."""
        if owner is not None:
            peer = self.peers.get(owner)
            if peer is not None and peer.port_for(broker_id) is not None:
                return owner
        return self.me

    def endpoint(self, slot: int, broker_id: int) -> tuple[int, str, int] | None:
        """(node id, host, port) of ``slot``'s listener for ``broker_id``."""
        peer = self.peers.get(slot)
        port = None if peer is None else peer.port_for(broker_id)
        if peer is None or port is None:
            return None
        return virtual_node(slot, broker_id), peer.host, port

"""kshare: share groups (KIP-932) for every Kafka cluster, as a wire-protocol proxy sidecar."""

__version__ = "0.1.0"

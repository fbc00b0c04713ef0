"""Durable share-partition state on a topic of the fronted cluster (the state store)."""

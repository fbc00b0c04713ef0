"""One module per share-group API key, each a thin translation from the wire to the service."""

from . import share_acknowledge, share_fetch, share_group_heartbeat

# The share-group APIs the proxy serves itself, one module per API key.
HANDLERS = (share_group_heartbeat, share_fetch, share_acknowledge)

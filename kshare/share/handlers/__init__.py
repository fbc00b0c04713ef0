"""One module per share-group API key, each a thin translation from the wire to the service."""

from . import (
    alter_share_group_offsets,
    delete_groups,
    delete_share_group_offsets,
    describe_share_group_offsets,
    join_group,
    list_groups,
    list_offsets,
    share_acknowledge,
    share_fetch,
    share_group_describe,
    share_group_heartbeat,
)
from .group_configs import DescribeConfigs, IncrementalAlterConfigs
from .share_state import DeleteShareGroupState, ReadShareGroupState, WriteShareGroupState

# Every API the share-group service answers, one handler per API key. Each has API_KEY, VERSIONS
# and handle(service, conn, header, body); those with applies(service, header, body) answer only
# the requests it accepts and leave the rest to the cluster.
HANDLERS = (
    share_group_heartbeat,
    share_group_describe,
    share_fetch,
    share_acknowledge,
    describe_share_group_offsets,
    alter_share_group_offsets,
    delete_share_group_offsets,
    list_groups,
    list_offsets,
    delete_groups,
    join_group,
    DescribeConfigs,
    IncrementalAlterConfigs,
    ReadShareGroupState,
    WriteShareGroupState,
    DeleteShareGroupState,
)

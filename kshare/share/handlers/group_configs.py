"""DescribeConfigs (32) and IncrementalAlterConfigs (44) for share groups (GROUP resources).

Every GROUP resource is answered here (a group that is no share group gets the share group
configs at their defaults, as on Kafka 4.4, besides what the cluster knows of it); a request
naming no GROUP resource is forwarded untouched (``applies`` is false for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..authorization import Operation
from ..config import CONFIG_DEFS, ConfigError, GroupConfig, validate
from ..errors import ErrorCode
from .common import admin_loaded, coordinated_elsewhere, group_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

GROUP = 32  # ConfigResource.Type.GROUP
SOURCE_DEFAULT, SOURCE_GROUP = 5, 8  # ConfigSource DEFAULT_CONFIG, GROUP_CONFIG
TYPES = {"boolean": 1, "string": 2, "int": 3}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

DescribeResponse = messages.message_class("DescribeConfigsResponse")
AlterResponse = messages.message_class("IncrementalAlterConfigsResponse")
LOADING = "The share group state is still loading."


def _is_share_config(name: str) -> bool:
    return name in CONFIG_DEFS


def describe_applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    return any(r.resource_type == GROUP for r in req.resources)


def alter_applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    return any(r.resource_type == GROUP and (not service.loaded or service.share_group(r.resource_name) is not None
                                            or coordinated_elsewhere(service, r.resource_name)
                                            or any(_is_share_config(c.name) for c in r.configs))
               for r in req.resources)


async def _forward(conn: ClientConnection, api_key: int, version: int, body: Any) -> Any:
    """Ask the cluster on the client's own connection: its ACLs decide, as without kshare."""
    return await conn.probe(api_key, version, body)


async def _ask_coordinators(service: ShareGroupService, api_key: int, resources: list[Any], results: dict[int, Any],
                            request: Any, answers: Any, failed: Any) -> None:
    """In an instance group: the GROUP resources coordinated by other proxies are asked of them
    (their configs live with the group's coordinator), one request per proxy."""
    by_owner: dict[str, tuple[Any, list[Any]]] = {}
    for r in resources:
        owner = service.ownership.owner_of_group(r.resource_name)
        if owner is None or service.peers is None:
            results[id(r)] = failed(r, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        elif service.is_me(owner):  # moving here: its state is being replayed
            results[id(r)] = failed(r, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        else:
            by_owner.setdefault(owner.id, (owner, []))[1].append(r)
    for owner, rs in by_owner.values():
        try:
            resp = await service.peers.request(owner, api_key, request(rs))
        except Exception:  # noqa: BLE001 - the coordinator may be moving: the client retries
            for r in rs:
                results[id(r)] = failed(r, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            continue
        for r, res in zip(rs, answers(resp), strict=False):
            results[id(r)] = res


COORDINATOR_SILENT = "The group's coordinator did not answer."


async def _sort_resources(service: ShareGroupService, resources: list[Any], share_group: Callable[[Any], bool],
                          failed: Callable[[Any, int, str], Any],
                          results: dict[int, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """The resources of a config request as (those of groups another proxy coordinates, those of
    share groups this proxy answers for, the rest: the cluster's). While the state loads, which
    groups are share groups is not known yet: every group resource is answered
    COORDINATOR_LOAD_IN_PROGRESS (put in ``results``)."""
    loading = not await admin_loaded(service)
    remote = [] if loading else [r for r in resources
                                 if r.resource_type == GROUP and coordinated_elsewhere(service, r.resource_name)]
    ours = [r for r in resources if r.resource_type == GROUP and r not in remote and (loading or share_group(r))]
    others = [r for r in resources if r not in ours and r not in remote]
    if loading:
        for r in ours:
            results[id(r)] = failed(r, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, LOADING)
        ours = []
    return remote, ours, others


class DescribeConfigs:
    API_KEY = ApiKey.DESCRIBE_CONFIGS
    VERSIONS = (0, 4)

    @staticmethod
    def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
        return describe_applies(service, header, req)

    @staticmethod
    async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
        version = header.api_version

        def failed(r: Any, code: int, message: str) -> Any:
            return DescribeResponse.DescribeConfigsResult(error_code=code, error_message=message, resource_type=GROUP,
                                                          resource_name=r.resource_name, configs=[])

        results: dict[int, Any] = {}
        remote, ours, others = await _sort_resources(
            service, req.resources, lambda r: service.share_group(r.resource_name) is not None, failed, results)
        if remote:
            await _ask_coordinators(service, 32, remote, results, lambda rs: type(req)(
                resources=rs, include_synonyms=req.include_synonyms, include_documentation=req.include_documentation),
                lambda resp: resp.results, lambda r, code: failed(r, code, COORDINATOR_SILENT))
        if others:
            cls = type(req)
            upstream = await _forward(conn, 32, version, cls(resources=others, include_synonyms=req.include_synonyms,
                                                                include_documentation=req.include_documentation))
            for r, res in zip(others, upstream.results, strict=False):
                if r.resource_type == GROUP and res.error_code != ErrorCode.GROUP_AUTHORIZATION_FAILED:
                    # A group that is no share group (yet): as on Kafka 4.4, every group has the
                    # share group configs, at their defaults. The cluster adds what it knows of
                    # the group (consumer group configs), or knows nothing of GROUP resources.
                    known = list(res.configs or []) if res.error_code == 0 else []
                    have = {c.name for c in known}
                    res = DescribeResponse.DescribeConfigsResult(
                        error_code=0, error_message=None, resource_type=GROUP, resource_name=r.resource_name,
                        configs=known + [c for c in _group_configs(GroupConfig(limits=service.limits), r, req)
                                         if c.name not in have])
                results[id(r)] = res
        for r in ours:
            group = service.share_group(r.resource_name)
            assert group is not None
            refusal = await group_refusal(service, conn, Operation.DESCRIBE_CONFIGS, r.resource_name)
            results[id(r)] = DescribeResponse.DescribeConfigsResult(
                error_code=refusal, error_message=None, resource_type=GROUP, resource_name=r.resource_name,
                configs=[] if refusal else _group_configs(group.config, r, req))
        return version, DescribeResponse(results=[results[id(r)] for r in req.resources])


def _group_configs(config: GroupConfig, resource: Any, req: Any) -> list[Any]:
    """The share group configs a DescribeConfigs resource asks for, with their sources."""
    names = resource.configuration_keys if resource.configuration_keys is not None else list(CONFIG_DEFS)
    configs = []
    for name in names:
        d = CONFIG_DEFS.get(name)
        if d is None:
            continue
        overridden = name in config.overrides
        configs.append(DescribeResponse.DescribeConfigsResourceResult(
            name=name, value=config.get(name), read_only=False, is_default=not overridden,
            config_source=SOURCE_GROUP if overridden else SOURCE_DEFAULT, is_sensitive=False,
            synonyms=[], config_type=TYPES[d.type], documentation=d.doc if req.include_documentation else None))
    return configs


class IncrementalAlterConfigs:
    API_KEY = ApiKey.INCREMENTAL_ALTER_CONFIGS
    VERSIONS = (0, 1)

    @staticmethod
    def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
        return alter_applies(service, header, req)

    @staticmethod
    async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
        version = header.api_version

        def failed(r: Any, code: int, message: str) -> Any:
            return AlterResponse.AlterConfigsResourceResponse(error_code=code, error_message=message,
                                                              resource_type=GROUP, resource_name=r.resource_name)

        results: dict[int, Any] = {}
        remote, ours, others = await _sort_resources(
            service, req.resources, lambda r: service.share_group(r.resource_name) is not None
            or any(_is_share_config(c.name) for c in r.configs), failed, results)
        if remote:
            await _ask_coordinators(service, ApiKey.INCREMENTAL_ALTER_CONFIGS, remote, results, lambda rs: type(req)(
                resources=rs, validate_only=req.validate_only), lambda resp: resp.responses,
                lambda r, code: failed(r, code, COORDINATOR_SILENT))
        if others:
            upstream = await _forward(conn, ApiKey.INCREMENTAL_ALTER_CONFIGS, version, type(req)(resources=others, validate_only=req.validate_only))
            for r, res in zip(others, upstream.responses, strict=False):
                results[id(r)] = res
        for r in ours:
            code, message = await group_refusal(service, conn, Operation.ALTER_CONFIGS, r.resource_name), None
            if not code:
                code, message = await _alter_group(service, r, req.validate_only)
            results[id(r)] = AlterResponse.AlterConfigsResourceResponse(
                error_code=code, error_message=message, resource_type=GROUP, resource_name=r.resource_name)
        return version, AlterResponse(responses=[results[id(r)] for r in req.resources])


async def _alter_group(service: ShareGroupService, r: Any, validate_only: bool) -> tuple[int, str | None]:
    group_id = r.resource_name
    if not group_id:
        return ErrorCode.INVALID_REQUEST, "The group id must not be empty."
    if service.share_group(group_id) is None and await service.classic_group_exists(group_id):
        return ErrorCode.INVALID_CONFIG, f"Group {group_id} is a consumer group, not a share group."
    changes: dict[str, str | None] = {}
    for c in r.configs:
        if c.config_operation not in (SET, DELETE):
            return ErrorCode.INVALID_CONFIG, f"Operation {c.config_operation} is not supported for {c.name}."
        value = c.value if c.config_operation == SET else None
        if c.config_operation == SET and value is None:
            return ErrorCode.INVALID_CONFIG, f"No value given for {c.name}."
        try:
            validate(c.name, value, service.limits)
        except ConfigError as exc:
            return ErrorCode.INVALID_CONFIG, str(exc)
        changes[c.name] = value
    if validate_only:
        return ErrorCode.NONE, None
    group = service.coordinator.ensure_group(group_id)
    for name, value in changes.items():
        if value is None:
            group.config.overrides.pop(name, None)
        else:
            group.config.overrides[name] = value
    service.apply_config(group)
    await service.persist_group_now(group)
    return ErrorCode.NONE, None

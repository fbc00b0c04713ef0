"""The proxy's one table of interceptions (``kshare.proxy.filters.INTERCEPTIONS``) says what the
proxy does: the handlers the share layer registers are the ones it declares served, the proxy
refuses to serve anything else (the downgrades it lists: tests/unit/test_client_connection.py)."""

from __future__ import annotations

import pytest

from kshare.protocol import messages
from kshare.proxy import filters
from kshare.proxy.config import ProxyConfig
from kshare.proxy.server import Proxy
from kshare.share.handlers import HANDLERS


def _name(handler) -> str:
    return handler.__name__ if isinstance(handler, type(filters)) else f"{handler.__module__}.{handler.__qualname__}"


def _proxy() -> Proxy:
    return Proxy(ProxyConfig(upstream=[("127.0.0.1", 9)]))


def test_every_share_handler_is_declared_served_by_it() -> None:
    declared = {k: s for k, s in filters.SERVED.items() if s.by.startswith("kshare.share.")}
    assert {h.API_KEY: _name(h) for h in HANDLERS} == {k: s.by for k, s in declared.items()}
    for h in HANDLERS:
        assert declared[h.API_KEY].some == hasattr(h, "applies"), filters.api_name(h.API_KEY)


def test_the_share_layer_registers_exactly_the_declared_handlers() -> None:
    from kshare.share.service import ShareGroupService

    proxy = _proxy()
    registered: dict[int, bool] = {}
    serve = proxy.serve

    def recording(api_key, lo, hi, handler, applies=None):
        registered[api_key] = applies is not None
        serve(api_key, lo, hi, handler, applies)  # the table's check runs

    proxy.serve = recording  # type: ignore[method-assign]
    ShareGroupService.register(object.__new__(ShareGroupService), proxy)
    assert registered == {k: s.some for k, s in filters.SERVED.items() if not s.newer_than_codec}


def test_the_proxy_serves_nothing_the_table_does_not_declare() -> None:
    proxy = _proxy()
    with pytest.raises(ValueError, match="not declared served"):
        proxy.serve(filters.METADATA, 0, 12, lambda conn, header, body: None)
    with pytest.raises(ValueError, match="declared served for the requests"):
        proxy.serve(filters.JOIN_GROUP, 0, 9, lambda conn, header, body: None)  # some: needs applies
    with pytest.raises(ValueError, match="whole"):
        proxy.serve(filters.SHARE_FETCH, 1, 2, lambda conn, header, body: None, lambda header, body: True)
    proxy.serve(filters.SHARE_FETCH, 1, 2, lambda conn, header, body: None)
    assert proxy.served_versions() == {filters.SHARE_FETCH: (1, 2)}


def test_api_versions_newer_than_the_codec_are_answered_by_the_proxy() -> None:
    proxy = _proxy()
    (key,) = [k for k, s in filters.SERVED.items() if s.newer_than_codec]
    top = messages.api(key).max_version
    assert filters.SERVED[key].by == "kshare.proxy.server.Proxy." + proxy.handler_for(key, top + 1).__name__
    assert proxy.handler_for(key, top) is None


def test_every_entry_intercepts_something_and_names_a_known_api() -> None:
    for key, entry in filters.INTERCEPTIONS.items():
        assert entry.downgrade or entry.served or entry.response, key
        assert key in messages.apis(), key
        if entry.downgrade is not None:  # the downgraded response streams: nothing to rewrite in it
            f = entry.response
            assert f is None or f.from_version > entry.downgrade.version

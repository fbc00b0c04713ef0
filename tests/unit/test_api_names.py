"""Metric labels name every Kafka API, with or without a spec of kshare's own."""

from kshare.metrics import _KAFKA_API_NAMES, api_name
from kshare.protocol import messages


def test_names_agree_with_the_specs_and_cover_forwarded_apis() -> None:
    for key, api in messages.apis().items():
        assert _KAFKA_API_NAMES[key] == api.name
    assert api_name(71) == "GetTelemetrySubscriptions"  # librdkafka sends it; forwarded, no spec
    assert api_name(1000) == "1000"

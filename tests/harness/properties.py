"""Hypothesis settings the stateful property tests share."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def stateful_settings(examples: int, steps: int) -> settings:
    """``examples`` runs of at most ``steps`` steps each, unless KSHARE_PROPERTY_EXAMPLES says how
    many runs (a few seconds in CI; KSHARE_PROPERTY_EXAMPLES=2000 for a deeper local run)."""
    return settings(
        max_examples=int(os.environ.get("KSHARE_PROPERTY_EXAMPLES", str(examples))),
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

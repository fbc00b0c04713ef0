"""The drain ratio of a share group's members: :mod:`kshare.bench.drain` (``kshare bench --only balance``
measures with it too), under the names the tests import."""

from kshare.bench.drain import DrainResult, drain, members_in_group, names  # noqa: F401 - re-exported

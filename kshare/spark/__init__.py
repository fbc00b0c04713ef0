"""The kshare PySpark data source: Spark executors as share-group members (docs/spark.md).

    from kshare.spark import register
    register(spark)                       # or spark.dataSource.register(ShareSource)
    spark.readStream.format("kshare").option("kafka.bootstrap.servers", ...) ...

Poison records: ``kshare.spark.reject(rows, options=...)`` inside ``foreachBatch``.

pyspark is imported only when the source itself is asked for, so the options, the commit
channel and ``reject`` can be used (and tested) without it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .options import OptionError, Options
from .rejects import RejectError, reject

if os.environ.get("KSHARE_SPARK_LOG"):  # e.g. KSHARE_SPARK_LOG=INFO: the source's activity on stderr
    logging.basicConfig(format="%(asctime)s %(process)d %(name)s %(message)s")
    logging.getLogger("kshare.spark").setLevel(os.environ["KSHARE_SPARK_LOG"].upper())

__all__ = ["SCHEMA", "OptionError", "Options", "RejectError", "ShareSource", "register", "reject"]


def __getattr__(name: str) -> Any:
    if name in ("ShareSource", "SCHEMA"):
        from . import source

        return getattr(source, name)
    raise AttributeError(name)


def register(spark: Any) -> type:
    """Register the ``kshare`` format on ``spark`` with Spark's default parallelism as the default
    of the ``parallelism`` option (a data source cannot ask Spark for it by itself)."""
    from .source import ShareSource

    # A class made here is pickled by value (it is not importable by name), so the default
    # travels with it to the Python processes where Spark instantiates the source.
    source = type("ShareSource", (ShareSource,), {"default_parallelism": spark.sparkContext.defaultParallelism})
    spark.dataSource.register(source)
    return source

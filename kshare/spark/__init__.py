"""The kshare PySpark data source: Spark executors as share-group members (docs/guide/spark.md).

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

from .options import NO_REUSE_REFUSED, SPECULATION_REFUSED, OptionError, Options
from .rejects import RejectError, reject

if os.environ.get("KSHARE_SPARK_LOG"):  # e.g. KSHARE_SPARK_LOG=INFO: the source's activity on stderr
    logging.basicConfig(format="%(asctime)s %(process)d %(name)s %(message)s")
    logging.getLogger("kshare.spark").setLevel(os.environ["KSHARE_SPARK_LOG"].upper())

__all__ = ["SCHEMA", "OptionError", "Options", "RejectError", "ShareSource", "register", "reject"]


def __getattr__(name: str) -> Any:
    if name in ("ShareSource", "SCHEMA"):
        from . import source  # pyspark, loaded only when the source is asked for (see above)

        return getattr(source, name)
    raise AttributeError(name)


def refuse_unsupported(spark: Any) -> None:
    """An :class:`OptionError` (one line) if ``spark`` runs speculative task attempts or does not
    reuse its Python workers (see docs/guide/spark.md)."""

    def conf(key: str, default: str) -> list[str]:
        values = [spark.conf.get(key, default)]
        try:
            values.append(spark.sparkContext.getConf().get(key, default))
        except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext; the session conf says it
            pass
        return [str(v).strip().lower() for v in values]

    if "true" in conf("spark.speculation", "false"):
        raise OptionError(SPECULATION_REFUSED)
    if "false" in conf("spark.python.worker.reuse", "true"):
        raise OptionError(NO_REUSE_REFUSED)


def register(spark: Any) -> type:
    """Register the ``kshare`` format on ``spark`` with Spark's default parallelism as the default
    of the ``parallelism`` option (a data source cannot ask Spark for it by itself). Refuses a
    session with ``spark.speculation=true`` or ``spark.python.worker.reuse=false``
    (:class:`OptionError`, one line)."""
    from .source import ShareSource  # pyspark: only when a session registers the source

    refuse_unsupported(spark)
    # A class made here is pickled by value (it is not importable by name), so the default
    # travels with it to the Python processes where Spark instantiates the source.
    source = type("ShareSource", (ShareSource,), {"default_parallelism": spark.sparkContext.defaultParallelism})
    spark.dataSource.register(source)
    return source

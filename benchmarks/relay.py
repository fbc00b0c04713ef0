"""A bare TCP byte relay on asyncio + uvloop: moved to :mod:`kshare.bench.relay` (``kshare bench`` uses it).

python benchmarks/relay.py --listen 127.0.0.1:19092 --upstream 127.0.0.1:9092
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kshare.bench.relay import main, serve  # noqa: E402, F401

if __name__ == "__main__":
    sys.exit(main())

"""What-if (not shipped): the plugin's host-tier eviction key replaced, then another script run.

    EVKEY=lru|lru_in_class PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-c/evict_order.py SCRIPT ARGS...

``lru``: plain LRU over GPU and host leaves (SGLang's own order); ``lru_in_class``: backed-up KV
before KV without a host copy, LRU within each (the expected-return order dropped). Used for the
miniswe rows of README.md ("where the time goes").
"""

import os
import runpy
import sys

from sglang_ext import order

V = os.environ.get("EVKEY", "")
_orig = order.eviction_key


def key(last_access_time, *, soft_leased=False, host_tier=False, reloadable=True, lease_due_back=None):
    if host_tier and V == "lru_in_class":
        return (0 if reloadable else 1, 0, last_access_time)
    if host_tier and V == "lru":
        return (0, 0, last_access_time)
    return _orig(last_access_time, soft_leased=soft_leased, host_tier=host_tier, reloadable=reloadable,
                 lease_due_back=lease_due_back)


order.eviction_key = key
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

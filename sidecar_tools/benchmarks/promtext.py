"""Scrape a Prometheus text endpoint and diff two scrapes (engine counters around one run).

A few lines of parsing instead of a dependency: we only need ``name{labels} value`` samples.
"""

from __future__ import annotations

import math
import re
from typing import Any

import aiohttp

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_created")


def parse(text: str, prefix: str = "") -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample whose name starts with ``prefix``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[m.group(1) + (m.group(2) or "")] = value
    return out


def is_counter(key: str) -> bool:
    name = key.split("{", 1)[0]
    return name.endswith(_COUNTER_SUFFIXES) and not name.endswith("_created")


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Counter increases during the run, and gauges as they stood at its end."""
    counters = {k: round(v - before.get(k, 0.0), 6) for k, v in after.items() if is_counter(k)}
    gauges = {k: v for k, v in after.items() if not is_counter(k) and "_bucket" not in k
              and not k.split("{", 1)[0].endswith("_created")}
    return {"counters": {k: v for k, v in counters.items() if v}, "gauges_after": gauges}


async def scrape(session: aiohttp.ClientSession, base_url: str, prefix: str = "") -> dict[str, float] | None:
    """The samples of ``<base_url>/metrics``, or None when the endpoint is missing or down."""
    try:
        async with session.get(base_url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            return parse(await r.text(), prefix)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None

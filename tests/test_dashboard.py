"""The Grafana dashboard (dashboards/sglang-sidecar.json) plots only series that exist: the
sidecar's own (scraped from a running sidecar), SGLang 0.5.23's (named in its installed source)
and the session_ttl plugin's (sglang_ext.metrics)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ext.metrics import METRIC_SPECS
from sidecar.server.app import create_app
from sidecar.settings import load_settings

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "sglang-sidecar.json"
METRIC = re.compile(r"\b(sidecar_[a-z0-9_]+|sglang(?:_ext)?:[a-z0-9_:]+)")
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def _panels(panels):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]


def _base(name: str) -> str:
    for part in HISTOGRAM_PARTS:
        if name.endswith(part):
            return name[: -len(part)]
    return name


def _sglang_names() -> set[str]:
    spec = importlib.util.find_spec("sglang")  # located, not imported
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed")
    source = Path(spec.origin).parent / "srt" / "observability"
    return {m for path in source.glob("*.py") for m in re.findall(r'"(sglang:[a-z0-9_:]+)"', path.read_text())}


@pytest.fixture
async def sidecar_names(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer) -> set[str]:
    """Every series name a sidecar serves once it answered one chat turn."""
    settings = load_settings(overrides={"server": {"sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir)},
                                        "policy": {"mode": "predictive"}, "admission": {"enabled": True}})
    client = await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
    assert resp.status == 200
    text = await (await client.get("/metrics")).text()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_panel_queries_something():
    exprs = _exprs()
    assert len(exprs) >= 20
    for expr in exprs:
        assert METRIC.search(expr), expr


async def test_every_metric_a_panel_reads_exists(sidecar_names):
    known = {_base(n) for n in sidecar_names} | sidecar_names
    known |= {n for n in _sglang_names()} | {spec[1] for spec in METRIC_SPECS.values()}
    missing = sorted({m for expr in _exprs() for m in METRIC.findall(expr) if m not in known and _base(m) not in known})
    assert missing == []


def test_panel_ids_are_unique_and_every_query_has_a_ref_id():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(set(refs)) == len(refs), p["title"]

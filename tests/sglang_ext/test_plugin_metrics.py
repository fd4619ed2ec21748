"""Lease metrics reach a Prometheus multiprocess registry the way SGLang's do.

SGLang's /metrics (main process) reads PROMETHEUS_MULTIPROC_DIR, which the
scheduler writes to. A child process plays the scheduler here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("prometheus_client")

SCHEDULER = textwrap.dedent(
    """
    from sglang_ext.metrics import LeaseMetrics

    m = LeaseMetrics()
    m.inc("grants", 3)              # before export: replayed on attach
    m.set("leased_tokens", 512)
    assert m.attach_prometheus({"model_name": "qwen", "tp_rank": 0})
    m.inc("expirations", tier="hard")
    m.inc("pressure_releases", 2, stage="prefill")
    m.set("leases", 4, tier="hard")
    m.set("leased_tokens", 700)
    m.inc("leased_evicted_tokens", 40, tier="soft")
    """
)


def test_metrics_reach_the_multiprocess_registry(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", SCHEDULER], check=True, env=env, timeout=60)

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    base = (("model_name", "qwen"), ("tp_rank", "0"))

    def value(name, **extra):
        return samples.get((name, tuple(sorted(base + tuple(extra.items())))))

    assert value("sglang_ext:session_lease_grants_total") == 3
    assert value("sglang_ext:session_leased_tokens") == 700
    assert value("sglang_ext:session_leases", tier="hard") == 4
    assert value("sglang_ext:session_lease_expirations_total", tier="hard") == 1
    assert (
        value("sglang_ext:session_lease_pressure_releases_total", stage="prefill") == 2
    )
    assert value("sglang_ext:session_leased_evicted_tokens_total", tier="soft") == 40

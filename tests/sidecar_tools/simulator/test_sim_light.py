"""Simulator pieces that need no SGLang: the CLI stays light, the cost model's arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from sidecar_tools.simulator.cli import parse_sidecar_policy
from sidecar_tools.simulator.costmodel import DEFAULT_CALIBRATION, CostModel, load_calibration


def test_cli_help_does_not_import_sglang_or_torch():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from sidecar.cli import main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0 and 'simulate' in r.output, r.output\n"
        "r = CliRunner().invoke(main, ['simulate', '--help'])\n"
        "assert r.exit_code == 0 and '--kv-tokens' in r.output and 'calibrate' in r.output, r.output\n"
        "heavy = [m for m in ('sglang', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sidecar_policy_flag():
    assert parse_sidecar_policy("none") is None
    assert parse_sidecar_policy("off") == {"mode": "off"}
    assert parse_sidecar_policy("predictive") == {"mode": "predictive"}
    assert parse_sidecar_policy("fixed:12.5") == {"mode": "fixed", "fixed_ttl": 12.5}
    assert parse_sidecar_policy("fixed") == {"mode": "fixed"}
    with pytest.raises(click.BadParameter):
        parse_sidecar_policy("sometimes")


def test_decode_jump_equals_single_steps():
    m = CostModel(step_s=0.005, decode_seq_s=1e-4, decode_ctx_token_s=3e-8)
    batch, ctx = 7, 70_000
    single = sum(m.decode_time(batch, ctx + i * batch) for i in range(50))
    assert m.decode_jump_time(batch, ctx, 50) == pytest.approx(single)
    for dt in (0.0, 0.001, 0.05, 0.3333, 2.0):
        k = m.decode_steps_to_reach(batch, ctx, dt)
        assert m.decode_jump_time(batch, ctx, k) >= dt
        assert k == 1 or m.decode_jump_time(batch, ctx, k - 1) < dt


def test_prefill_time_counts_causal_attention():
    m = CostModel(step_s=0.0, prefill_token_s=1e-5, prefill_pair_ratio=1e-4)
    # 10 new tokens on 100 cached: 10 * 100 + 10 * 11 / 2 pairs
    assert m.prefill_time([(10, 100)]) == pytest.approx(1e-5 * 10 + 1e-9 * (1000 + 55))
    assert m.prefill_time([(10, 0), (5, 5)]) == pytest.approx(1e-5 * 15 + 1e-9 * (55 + 25 + 15))


def test_committed_calibration_names_its_sources():
    model, doc = load_calibration()
    assert isinstance(model, CostModel)
    names = {s["name"] for s in doc["sources"]}
    assert {"lru-0.5s", "unconstrained-0.5s"} <= names
    assert doc["fit"]["fit_targets"] and all(s.get("gpu") is None or "makespan_s" in s["gpu"] for s in doc["sources"])
    json.dumps(doc)  # plain JSON
    assert DEFAULT_CALIBRATION.name.endswith(".json")


def test_a_prefill_waits_for_its_load_layer_by_layer():
    m = CostModel(model_layers=4)
    compute = 0.1
    assert m.prefill_time_with_load(compute, 0.0, 0.0) == pytest.approx(compute)  # nothing to load
    assert m.prefill_time_with_load(compute, -1.0, -0.5) == pytest.approx(compute)  # landed before the step
    # a short load: the first layer's copy, then all compute
    assert m.prefill_time_with_load(compute, 0.0, 0.04) == pytest.approx(0.01 + compute)
    # a long load: the last layer's copy, then one layer's compute
    assert m.prefill_time_with_load(compute, 0.0, 1.0) == pytest.approx(1.0 + compute / 4)
    # a copy queued behind another one starts later, and the step with it
    assert m.prefill_time_with_load(compute, 0.5, 1.5) == pytest.approx(1.5 + compute / 4)


def test_host_pool_is_sized_as_sglang_sizes_it():
    from sidecar_tools.simulator.hicache_cpu import HostTierArgs

    assert HostTierArgs().host_tokens(173_200, 147_456) == 346_400  # SGLang's default ratio 2.0
    assert HostTierArgs(ratio=3.0).host_tokens(173_200, 147_456) == 519_600
    assert HostTierArgs(ratio=3.0, size_gb=10).host_tokens(173_200, 147_456) == int(10e9 // 147_456)
    assert HostTierArgs(ratio=3.0, size_gb=10, size_tokens=5000).host_tokens(173_200, 147_456) == 5000
    for bad in ({"ratio": 0.0}, {"size_tokens": -1}, {"write_policy": "sometimes"}):
        with pytest.raises(ValueError):
            HostTierArgs(**bad)


def test_copies_queue_per_direction_and_land_on_the_virtual_clock():
    from sidecar_tools.simulator.hicache_cpu import VIRTUAL_DEVICE, CopyEngine, CopyRate

    clock = {"now": 10.0}
    copies = CopyEngine(lambda: clock["now"], load=CopyRate(1000.0, 0.01), write=CopyRate(500.0))
    load, write = VIRTUAL_DEVICE.Stream(), VIRTUAL_DEVICE.Stream()
    copies.adopt(load, "load", kv_tensors=2)
    copies.adopt(write, "write", kv_tensors=2)

    def submit(stream, tokens):  # what l2_transfer does per submission: wait, copy (K and V), record
        start, done = VIRTUAL_DEVICE.Event(), VIRTUAL_DEVICE.Event()
        start.record()  # on the forward's stream: now
        with VIRTUAL_DEVICE.stream(stream):
            start.wait(stream)
            stream.charge(tokens, 2)
            done.record()
        return done

    first, second = submit(load, 100), submit(load, 100)
    backup = submit(write, 100)
    assert first.at == pytest.approx(10.11) and first.copy_from == pytest.approx(10.01)
    assert second.at == pytest.approx(10.22)  # queued behind the first load
    assert backup.at == pytest.approx(10.2)  # the other direction runs alongside
    assert not first.query() and copies.next_landing() == pytest.approx(10.2)
    clock["now"] = 10.15
    assert first.query() and not second.query()
    assert first.elapsed_time(second) == pytest.approx(110.0)  # ms
    second.synchronize()  # a blocking wait: the host thread stalls until the copy lands
    assert copies.take_stall() == pytest.approx(10.22) and copies.take_stall() is None
    unbound = VIRTUAL_DEVICE.Event()
    unbound.record()
    assert unbound.query()  # no CopyEngine: synchronous, like torch.cpu

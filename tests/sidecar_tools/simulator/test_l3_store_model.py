"""The shared L3 store's model (no SGLang): what it holds when, and where reading beats recomputing."""

from __future__ import annotations

import pytest

from sidecar_tools.simulator.costmodel import CostModel, load_calibration
from sidecar_tools.simulator.l3_store_model import SharedL3, break_even_gbps
from sidecar_tools.simulator.workers import WorkerLoss, check_losses


def test_a_write_counts_only_once_it_has_landed():
    store = SharedL3(bytes_per_token=1e6, read_gbps=1.0)  # 1 ms per token
    store.write("s", stored_tokens=1000, new_tokens=1000, now=10.0)  # lands at 11 s
    assert store.stored("s", 10.5) == 0
    assert store.stored("s", 11.0) == 1000
    store.write("s", stored_tokens=1200, new_tokens=200, now=20.0)  # lands at 20.2 s
    assert store.stored("s", 20.1) == 1000 and store.stored("s", 20.2) == 1200
    assert store.stored("other", 99.0) == 0


def test_a_read_takes_latency_plus_bytes_over_bandwidth_and_is_counted():
    store = SharedL3(bytes_per_token=147_456, read_gbps=4.0, latency_s=0.005)
    assert store.read(20_000) == pytest.approx(0.005 + 20_000 * 147_456 / 4e9)
    assert store.read(0) == 0.0
    assert store.report()["reads"] == 1 and store.report()["read_tokens"] == 20_000


def test_reading_at_the_break_even_bandwidth_takes_as_long_as_the_prefill():
    cost = load_calibration()[0]
    for tokens in (2_000, 20_000, 60_000):
        gbps = break_even_gbps(cost, tokens)
        read = SharedL3(cost.kv_bytes_per_token, read_gbps=gbps, latency_s=0.0).read(tokens)
        assert read == pytest.approx(cost.prefill_time([(tokens, 0)]))
    # attention grows with the context: the longer the history, the slower a store may be and still pay
    assert break_even_gbps(cost, 60_000) < break_even_gbps(cost, 20_000) < break_even_gbps(cost, 2_000)
    # a slower GPU (twice the prefill time per token) makes a given store pay sooner
    slow = cost.replace(prefill_token_s=2 * cost.prefill_token_s)
    assert break_even_gbps(slow, 20_000) < break_even_gbps(cost, 20_000)
    assert break_even_gbps(CostModel(), 0) == 0.0


@pytest.mark.parametrize("text", ["1", "a@3", "1@", "-1@2", "1@-2"])
def test_a_worker_loss_is_w_at_t(text):
    with pytest.raises(ValueError, match="W@T"):
        WorkerLoss.parse(text)
    assert WorkerLoss.parse("2@30.5") == WorkerLoss(2, 30.5)


def test_losses_must_leave_a_worker():
    check_losses([WorkerLoss(0, 1)], workers=2)
    with pytest.raises(ValueError, match="every worker"):
        check_losses([WorkerLoss(0, 1), WorkerLoss(1, 5)], workers=2)

"""The admission budget: the whole hierarchy less the headroom's share of the GPU pool.

The headroom keeps room for prefill chunks and decode growth, which only the GPU pool needs. Taken as a
fraction of GPU + host it held a 24-agent wave at the door although its KV fit the host tier three
times the GPU's (two first turns 0.8 s late, the simulated 0.5 s reference p90 1.05x of stock).
"""

import pytest

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.placement import Placement

GPU = 173_200


def _budget(capacity: EngineCapacity, distinct: bool, headroom: float = 0.9) -> float:
    return Placement(capacity, "w", headroom, residency=None, projection=None, clock=lambda: 0.0,
                     distinct=distinct).budget(capacity)


@pytest.mark.parametrize(("host", "policy", "distinct", "expected"), [
    (0, "write_through", True, 0.9 * GPU),  # no host tier: the GPU pool less its headroom, as before
    (3 * GPU, "write_through", True, 3 * GPU - 0.1 * GPU),  # write-through: the host holds everything once
    (GPU, "write_through", True, 0.9 * GPU),  # ratio 1 write-through: one pool's worth
    (GPU, "write_back", True, 2 * GPU - 0.1 * GPU),  # write-back: both pools hold distinct KV
    (3 * GPU, "write_through", False, 4 * GPU - 0.1 * GPU),  # the sum, when asked for
])
def test_the_headroom_is_taken_from_the_gpu_pool_only(host, policy, distinct, expected):
    capacity = EngineCapacity(max_total_num_tokens=GPU, host_tokens=host, host_write_policy=policy)
    assert _budget(capacity, distinct) == pytest.approx(expected)


def test_unknown_capacity_admits_against_nothing():
    assert _budget(EngineCapacity(max_total_num_tokens=0), distinct=True) == 0

"""The CPU host tier runs SGLang's own HiCache code and really moves the KV."""

from __future__ import annotations

from array import array

import pytest

pytest.importorskip("sglang")

from sidecar_tools.simulator.hicache_cpu import TRANSFERS, attach_host_tier  # noqa: E402


def match(cache, tokens):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))


def test_kv_survives_write_through_demotion_and_load_back(kit, plugin):
    cache = kit.make_cache(256, policy="lru")
    cc = attach_host_tier(cache, host_tokens=512)
    assert type(cc).__name__ == "HybridCacheController" and cc.mem_pool_host.size == 513
    prompt, out = list(range(1000, 1100)), list(range(1900, 1920))
    req = kit.finish(cache, None, prompt, out)
    k = cache.token_to_kv_pool_allocator.get_kvcache().k_buffer[0]
    rows = cache.path_device_indices(req.last_node)
    k[rows] = kit.torch.arange(1, len(rows) + 1, dtype=k.dtype).view(-1, 1, 1).expand_as(k[rows])
    cache.check_hicache_events()  # the scheduler's poll: submits and reaps the write-through
    assert cache.evictable_size() == 120 and not cache.ongoing_write_through

    kit.evict_all(cache)  # backed up: only the GPU pages go
    k.zero_()
    m = match(cache, prompt + out + [5])
    assert (m.device_prefix_len, m.host_hit_length) == (0, 120)

    assert cache.load_back(m.best_match_node)
    producer = cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    assert cache.is_load_back_event_done(producer) and not cache.ongoing_load_back
    m = match(cache, prompt + out + [5])
    assert (m.device_prefix_len, m.host_hit_length) == (120, 0)
    rows = cache.path_device_indices(m.last_device_node)
    assert k[rows][:, 0, 0].tolist() == list(range(1, 121))


def test_held_transfers_stay_in_flight_until_released(kit, plugin):
    with TRANSFERS.hold() as gate:
        cache = kit.make_cache(256, policy="lru")
        attach_host_tier(cache, host_tokens=512)
        kit.finish(cache, None, list(range(1000, 1100)), [1, 2, 3])
        cache.check_hicache_events()
        assert cache.ongoing_write_through and cache.protected_size() == 103  # backup in flight
        gate.release()
        cache.check_hicache_events()
        assert not cache.ongoing_write_through and cache.protected_size() == 0

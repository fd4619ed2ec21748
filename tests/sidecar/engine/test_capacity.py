"""What the sidecar reads of a worker's /server_info: GPU pool, host tier, limits, the plugin."""

from sidecar.engine.capacity import EngineCapacity

GPU = 173_200


def test_without_a_host_tier_only_the_gpu_pool_counts():
    cap = EngineCapacity.from_server_info({"max_total_num_tokens": GPU, "max_req_input_len": 40_959})
    assert cap.known and cap.host_tokens == 0 and cap.hierarchy_tokens == GPU
    assert cap.max_req_input_len == 40_959 and not cap.plugin


def test_hicache_ratio_sizes_the_host_tier_as_sglang_does():
    info = {"max_total_num_tokens": GPU, "enable_hierarchical_cache": True, "hicache_ratio": 3.0, "hicache_size": 0}
    # the H200 run with --hicache-ratio 3 allocated 519,601 host tokens
    assert EngineCapacity.from_server_info(info).host_tokens == 519_601
    assert EngineCapacity.from_server_info(info).hierarchy_tokens == GPU + 519_601


def test_the_plugins_measurement_of_the_host_pool_wins():
    info = {"max_total_num_tokens": GPU, "enable_hierarchical_cache": True, "hicache_ratio": 3.0,
            "internal_states": [{"session_ttl": {"tier_tokens": {"gpu": GPU, "host": 400_000}}}]}
    cap = EngineCapacity.from_server_info(info)
    assert cap.plugin and cap.host_tokens == 400_000


def test_host_tiers_that_hold_no_cache_or_cannot_be_sized_count_nothing():
    base = {"max_total_num_tokens": GPU, "enable_hierarchical_cache": True, "hicache_ratio": 2.0}
    assert EngineCapacity.from_server_info({**base, "hicache_host_memory_mode": "buffer_only"}).host_tokens == 0
    assert EngineCapacity.from_server_info({**base, "hicache_size": 64}).host_tokens == 0  # GB: layout unknown here
    assert EngineCapacity.from_server_info({**base, "enable_hierarchical_cache": False}).host_tokens == 0


def test_an_engine_that_did_not_answer_is_unknown():
    assert not EngineCapacity.from_server_info({}).known

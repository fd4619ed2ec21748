"""The /generate request of a turn: the sidecar's sampling words under SGLang's names, stop ids,
and the lease under the plugin's key."""

from sglang_ext.wire import EXPECTED_BACK_PARAM, EXPECTED_SPREAD_PARAM, LEASE_TTL_PARAM, parse_after_turn_key

from sidecar.engine.generate import after_turn_body, generate_request, sampling_params
from sidecar.turn.request import Sampling
from sidecar.engine.lease import LeaseRequest
from sidecar.id_text import IdText

EOS = [151645, 151643]


def test_sampling_goes_out_under_sglangs_names_and_unset_values_stay_out():
    params = sampling_params(Sampling(max_tokens=7, temperature=0.2, min_tokens=2, seed=42, top_k=5), 4096, EOS, None)
    assert params == {
        "max_new_tokens": 7,
        "temperature": 0.2,
        "top_k": 5,
        "min_new_tokens": 2,
        "sampling_seed": 42,
        "stop_token_ids": EOS,
    }
    assert sampling_params(Sampling(), 4096, EOS, None)["max_new_tokens"] == 4096  # the configured default


def test_stop_ids_are_the_models_end_tokens_and_the_requests_unless_eos_is_ignored():
    assert sampling_params(Sampling(stop_token_ids=[9]), 16, EOS, None)["stop_token_ids"] == EOS + [9]
    assert "stop_token_ids" not in sampling_params(Sampling(ignore_eos=True, stop_token_ids=[9]), 16, EOS, None)
    assert "stop_token_ids" not in sampling_params(Sampling(), 16, [], None)


def test_the_lease_rides_in_custom_params_under_the_plugins_key():
    assert sampling_params(Sampling(), 16, EOS, LeaseRequest(12.5))["custom_params"] == {LEASE_TTL_PARAM: 12.5}
    assert "custom_params" not in sampling_params(Sampling(), 16, EOS, None)
    # with the expected return, so that a host tier can prefetch the KV just before it
    expecting = sampling_params(Sampling(), 16, EOS, LeaseRequest(12.5, expected_back_s=0.6, spread_s=0.2))
    assert expecting["custom_params"] == {LEASE_TTL_PARAM: 12.5, EXPECTED_BACK_PARAM: 0.6, EXPECTED_SPREAD_PARAM: 0.2}


def test_the_after_turn_update_uses_the_plugins_channel():
    body = after_turn_body("agent-1", LeaseRequest(8.0, expected_back_s=0.5, spread_s=0.1))
    assert body == {"server_args": {"sglang_ext:ttl:agent-1": 8.0, "sglang_ext:expect:agent-1": 0.5,
                                    "sglang_ext:spread:agent-1": 0.1}}
    assert parse_after_turn_key("sglang_ext:expect:agent-1") == ("expect", "agent-1")


def test_each_request_has_its_own_rid_and_carries_the_session():
    ids = IdText([1, 2, 3])
    a, b = generate_request(ids, "agent-1", {"max_new_tokens": 1}), generate_request(ids, "agent-1", {"max_new_tokens": 1})
    assert a["rid"] != b["rid"] and a["rid"].startswith("sidecar-")
    assert a["input_ids"] is ids and a["session_id"] == "agent-1" and a["sampling_params"] == {"max_new_tokens": 1}

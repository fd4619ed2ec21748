"""The plugin loads through SGLang's real entry-point mechanism and activates
``--radix-eviction-policy session_ttl`` without touching SGLang's source."""

from __future__ import annotations

import logging
import pickle
from importlib.metadata import entry_points

import pytest

pytest.importorskip("sglang")


def test_entry_point_is_installed():
    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    assert "session_ttl" in eps, "run: pip install -e . --no-deps"
    assert eps["session_ttl"].value == "sglang_ext.plugin:register"


def test_load_plugins_applies_every_hook(plugin):
    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = [target for target, _, _ in plugin.hook_table()]
    # HookRegistry only logs a target it cannot patch; all of ours must be patched.
    missing = [t for t in targets if t not in HookRegistry._patched]
    assert not missing
    from sglang.srt.managers.scheduler import Scheduler

    assert hasattr(
        Scheduler._get_new_batch_prefill_raw, "__wrapped__"
    )  # patched in place


def test_policy_is_selectable_from_the_cli(plugin):
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.server_args import prepare_server_args

    assert RADIX_EVICTION_POLICY_CHOICES.count("session_ttl") == 1
    args = prepare_server_args(
        [
            "--model-path",
            "dummy",
            "--radix-eviction-policy",
            "session_ttl",
            "--radix-eviction-policy-config",
            '{"max_leased_fraction": 0.6, "default_ttl_s": 0}',
        ]
    )
    assert args.radix_eviction_policy == "session_ttl"
    assert args.radix_eviction_policy_config == {
        "max_leased_fraction": 0.6,
        "default_ttl_s": 0,
    }


def test_settings_are_checked_during_server_arg_resolution(plugin):
    from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.server_args import prepare_server_args

    base = ["--model-path", "dummy", "--radix-eviction-policy", "session_ttl"]
    run_hook(handle_cache_compatibility, prepare_server_args(base))
    bad = prepare_server_args(base + ["--radix-eviction-policy-config", '{"ttl": 5}'])
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['ttl'\] for the 'session_ttl'"
    ):
        run_hook(handle_cache_compatibility, bad)


def test_strategy_factory_takes_the_policy_config(plugin):
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    from sglang_ext.strategy import SessionTTLStrategy

    s = get_eviction_strategy(
        "session_ttl", {"max_leased_fraction": 0.25, "default_ttl_s": 3}
    )
    assert isinstance(s, SessionTTLStrategy)
    assert s.settings.max_leased_fraction == 0.25 and s.settings.default_ttl_s == 3.0
    with pytest.raises(ValueError, match="unknown key"):
        get_eviction_strategy("session_ttl", {"max_lease_fraction": 0.25})


def test_cache_gets_python_tree_core_and_logs_settings(plugin, kit, caplog):
    caplog.set_level(logging.INFO)
    cache = kit.make_cache(128, config={"max_leased_fraction": 0.4})  # no backend given
    assert type(cache.tree_core).__name__ == "UnifiedTreeCore"  # the Python core
    assert type(cache.tree_core.eviction_strategy).__name__ == "SessionTTLStrategy"
    text = caplog.text
    assert "session_ttl eviction policy active (max_leased_fraction=0.4" in text
    assert "Using the Python TreeCore: the session_ttl eviction policy" in text
    # Other policies keep SGLang's behaviour and get no lease manager.
    lru = kit.make_cache(128, policy="lru")
    assert plugin.manager_of(lru) is None and plugin.manager_of(cache) is not None


def test_lease_ttl_survives_sglang_request_validation(plugin):
    """The fixed lease channel: sampling_params.custom_params.session_lease_ttl_s."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    body = {
        "input_ids": [1, 2, 3],
        "session_id": "agent-1",
        "sampling_params": {
            "max_new_tokens": 8,
            "custom_params": {"session_lease_ttl_s": 12.5},
        },
    }
    assert generate_contract_error(body) is None  # /generate's schema check
    assert (
        generate_contract_error({**body, "sampling_params": {"lease_ttl": 1}})
        is not None
    )

    obj = GenerateReqInput(**body)
    obj.normalize_batch_and_arguments()
    assert obj.session_id == "agent-1"
    # What TokenizerManager does with the dict, then the pickle IPC hop.
    sp = SamplingParams(**obj.sampling_params)
    sp.normalize(None)
    sp.verify(1000)
    sp = pickle.loads(pickle.dumps(sp))
    assert sp.custom_params == {"session_lease_ttl_s": 12.5}

"""Replay against the SGLang stand-in, which enforces SGLang 0.5.23's /generate contract."""

from sidecar_tools.benchmarks.clients import ClientOptions
from sidecar_tools.benchmarks.replay import replay
from sidecar_tools.benchmarks.traces import build_config, generate


async def test_generate_mode_satisfies_the_sglang_contract(make_sglang_double):
    double = await make_sglang_double(enable_session_radix_cache=True)
    trace = generate(build_config("reference", sessions=3, turns=3, tool_wait=0.01))
    run, records = await replay(trace, url=double.url, mode="generate",
                                opts=ClientOptions(lease_ttl_s=12.0, close_sessions=True))
    s = run["summary"]
    assert s["turns_ok"] == 9, s["errors"]
    assert len(double.closed_sessions) == 3
    # SGLang does not cache the last sampled token, so at most one token a turn is recomputed.
    assert s["recomputed_tokens"] <= 6


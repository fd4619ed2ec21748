"""What an operator reads: /metrics (latencies, engine up, sessions by state, disconnects apart
from errors), the access log (errors and slow requests, with the session, never content), JSON
log lines and the start-up summary."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

from sidecar import logs
from sidecar.engine.health import EngineHealth
from sidecar.metrics import SidecarMetrics
from sidecar.server.app import create_app
from sidecar.settings import load_settings

SECRET = "the launch codes are 0000"


@pytest.fixture
def start(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer):
    """``client = await start(server={...}, policy={...})``: a sidecar in front of the double."""

    async def make(**sections):
        server = {"sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir), **sections.pop("server", {})}
        settings = load_settings(overrides={"server": server, **sections})
        return await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))

    return make


async def _samples(client) -> dict[str, float]:
    text = await (await client.get("/metrics")).text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def _chat(client, body, headers=None):
    resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    return resp.status, await resp.read()


async def test_time_to_first_token_and_inter_token_latency_are_histograms(start, sglang_double, sse):
    client = await start()
    sglang_double.token_delay = 0.02
    sglang_double.responder = scripted_responder(list(range(1000, 1010)) + [IM_END_ID])
    status, raw = await _chat(client, {"messages": [{"role": "user", "content": "go"}], "stream": True,
                                       "stream_options": {"include_usage": True}})
    assert status == 200
    completion = sse(raw)[-2]["usage"]["completion_tokens"]
    m = await _samples(client)
    assert m["sidecar_time_to_first_token_seconds_count"] == 1
    assert m["sidecar_time_to_first_token_seconds_sum"] > 0
    # every token after the first is one inter-token observation, each about the double's delay
    assert m["sidecar_inter_token_latency_seconds_count"] == completion - 1
    mean_itl = m["sidecar_inter_token_latency_seconds_sum"] / m["sidecar_inter_token_latency_seconds_count"]
    assert 0.015 < mean_itl < 0.5
    assert m['sidecar_inter_token_latency_seconds_bucket{le="0.01"}'] == 0


async def test_a_client_that_disconnects_is_counted_apart_from_server_errors(start, sglang_double, caplog):
    client = await start()
    sglang_double.token_delay = 0.05
    sglang_double.responder = scripted_responder(list(range(1000, 1100)))
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "long"}], "stream": True})
    await resp.content.readline()
    resp.close()
    for _ in range(100):
        await asyncio.sleep(0.05)
        m = await _samples(client)
        if any('status="499"' in k for k in m):
            break
    chat = 'route="/v1/chat/completions"'
    assert m[f'sidecar_requests_total{{{chat},status="499"}}'] == 1
    assert not any(chat in k and 'status="5' in k for k in m)
    assert "unhandled error" not in caplog.text


async def test_engine_up_sessions_by_state_and_no_created_series(start, sglang_double):
    client = await start(policy={"mode": "fixed", "fixed_ttl": 60.0})
    await _chat(client, {"messages": [{"role": "user", "content": "a"}]}, {"X-Session-Id": "leased-one"})
    text = await (await client.get("/metrics")).text()
    assert "_created" not in text
    m = await _samples(client)
    assert m["sidecar_engine_up"] == 1
    assert m['sidecar_sessions_by_state{state="leased"}'] == 1
    assert m['sidecar_sessions_by_state{state="generating"}'] == 0 and m['sidecar_sessions_by_state{state="idle"}'] == 0
    sglang_double.healthy = False
    assert (await client.get("/health")).status == 503
    assert (await _samples(client))["sidecar_engine_up"] == 0


def test_engine_health_logs_each_change_once(caplog):
    health = EngineHealth(SidecarMetrics(), "http://engine")
    with caplog.at_level(logging.INFO, logger="sidecar"):
        for up in (True, True, False, False, True):
            health.record(up)
    assert [r.getMessage() for r in caplog.records] == [
        "SGLang at http://engine stopped answering /health",
        "SGLang at http://engine answers /health again",
    ]


async def test_access_log_names_errors_and_slow_requests_with_their_session_never_content(start, sglang_double, caplog):
    client = await start(server={"log_slow_requests": 0.5})
    await _chat(client, {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2})
    with caplog.at_level(logging.INFO, logger="sidecar.access"):
        status, _ = await _chat(client, {"model": "gpt-4o", "messages": [{"role": "user", "content": SECRET}]},
                                {"X-Session-Id": "agent-7"})
        assert status == 404
        assert (await _chat(client, {"messages": [{"role": "user", "content": SECRET}], "max_tokens": 2}))[0] == 200  # fast
        sglang_double.token_delay = 0.1
        sglang_double.responder = scripted_responder(list(range(1000, 1010)) + [IM_END_ID])
        assert (await _chat(client, {"messages": [{"role": "user", "content": SECRET + " slow"}]}))[0] == 200
    lines = [r for r in caplog.records if r.name == "sidecar.access"]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    refused, slow = lines
    assert refused.getMessage().startswith("POST /v1/chat/completions 404 ")
    assert "session=agent-7" in refused.getMessage() and "error=model_not_found" in refused.getMessage()
    assert refused.status == 404 and refused.session == "agent-7"
    assert slow.getMessage().endswith("(slow)") and slow.status == 200 and slow.duration_ms >= 500
    assert slow.session.startswith("sess-")  # an implicit session, once recognised
    assert SECRET not in caplog.text


async def test_a_stream_that_ended_in_an_error_event_is_logged(start, sglang_double, qwen3_tokenizer, caplog):
    client = await start()
    sglang_double.faults.drop_next, sglang_double.faults.drop_after_tokens = 1, 3
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(" a b c d e f g h", add_special_tokens=False))
    with caplog.at_level(logging.INFO, logger="sidecar.access"):
        status, raw = await _chat(client, {"messages": [{"role": "user", "content": "x"}], "stream": True},
                                  {"X-Session-Id": "dropped"})
    assert status == 200 and b"engine_unavailable" in raw
    (line,) = [r for r in caplog.records if r.name == "sidecar.access"]
    assert line.status == 200 and line.error == "engine_unavailable" and line.session == "dropped"


def test_json_log_lines_carry_the_session(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("info", "json")
        with logs.request_context():
            logs.bind_session("agent-9")
            logging.getLogger("sidecar.access").info("POST /v1/chat/completions 400", extra={"status": 400})
        logging.getLogger("sidecar").info("outside any request")
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["level"] == "INFO" and first["logger"] == "sidecar.access" and first["status"] == 400
    assert first["session"] == "agent-9" and first["message"] == "POST /v1/chat/completions 400" and "time" in first
    assert "session" not in second


async def test_one_start_up_summary_line(make_sglang_double, aiohttp_client, qwen3_tokenizer_dir, qwen3_tokenizer, caplog):
    double = await make_sglang_double(max_total_num_tokens=12345)
    settings = load_settings(overrides={
        "server": {"sglang_url": double.url, "tokenizer": str(qwen3_tokenizer_dir), "api_key": "k1", "port": 8123},
        "policy": {"mode": "fixed", "fixed_ttl": 30.0},
        "admission": {"enabled": True},
    })
    with caplog.at_level(logging.INFO, logger="sidecar"):
        await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting on")]
    assert line.startswith(f"starting on http://127.0.0.1:8123/v1 in front of SGLang at {double.url}")
    for part in (f"model {double.served_model_name}", "KV: GPU 12,345 tokens, no host tier, no session_ttl plugin",
                 "policy fixed (30 s leases)",
                 "admission on (headroom 0.9", "auth on (--api-key)"):
        assert part in line, (part, line)
    assert "k1" not in line


async def test_start_up_summary_names_the_host_tier_and_the_plugin(make_sglang_double, aiohttp_client,
                                                                     qwen3_tokenizer_dir, qwen3_tokenizer, caplog):
    hicache = await make_sglang_double(  # stock SGLang with --enable-hierarchical-cache --hicache-ratio 3
        max_total_num_tokens=10000,
        server_info_overrides={"enable_hierarchical_cache": True, "hicache_ratio": 3.0, "hicache_size": 0},
    )
    plugin = await make_sglang_double(max_total_num_tokens=10000, policy="session_ttl")
    lines = {}
    for name, double in (("hicache", hicache), ("plugin", plugin)):
        settings = load_settings(overrides={"server": {"sglang_url": double.url, "tokenizer": str(qwen3_tokenizer_dir)}})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sidecar"):
            await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))
        (lines[name],) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting on")]
    assert "KV: GPU 10,000 tokens, host 30,001 tokens, no session_ttl plugin (leases off)" in lines["hicache"]
    assert "KV: GPU 10,000 tokens, no host tier, session_ttl plugin" in lines["plugin"]


async def test_event_loop_lag_shows_work_that_held_the_loop(start):
    """An operator sees a stalled loop: 150 ms of work holding it is one lag observation over
    100 ms, while an idle loop's timer fires within a few milliseconds."""
    client = await start()
    await asyncio.sleep(0.2)
    before = await _samples(client)
    assert before["sidecar_event_loop_lag_seconds_count"] >= 3
    assert before['sidecar_event_loop_lag_seconds_bucket{le="0.1"}'] == before["sidecar_event_loop_lag_seconds_count"]
    time.sleep(0.15)  # the loop (this test's, the app's) is held
    await asyncio.sleep(0.05)
    after = await _samples(client)
    over = lambda m: m["sidecar_event_loop_lag_seconds_count"] - m['sidecar_event_loop_lag_seconds_bucket{le="0.1"}']
    assert over(after) - over(before) == 1

"""The SGLang double must follow SGLang 0.5.23's HTTP contract, or sidecar tests lie."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from sglang_double import (
    ENDOFTEXT_ID,
    IM_END_ID,
    PrefixCache,
    SGLangDouble,
    parse_sse,
    run_in_thread,
    scripted_responder,
)


async def post(url: str, path: str, body: dict) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json=body) as resp:
            return resp.status, await resp.text()


async def generate(double: SGLangDouble, **body) -> dict:
    status, text = await post(double.url, "/generate", body)
    assert status == 200, text
    return json.loads(text)


# --------------------------------------------------------------------------- /generate basics


async def test_non_streaming_response_shape(sglang_double):
    out = await generate(sglang_double, rid="r1", input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 5})
    assert "text" not in out  # --skip-tokenizer-init
    assert len(out["output_ids"]) == 5
    meta = out["meta_info"]
    assert meta["id"] == "r1"
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 5
    assert meta["cached_tokens"] == 0 and "cached_tokens_details" not in meta
    assert meta["e2e_latency"] >= 0
    assert all(0 <= t < ENDOFTEXT_ID for t in out["output_ids"])


async def test_default_max_new_tokens_is_128_and_output_is_deterministic(sglang_double):
    a = await generate(sglang_double, input_ids=[5, 6, 7])
    b = await generate(sglang_double, input_ids=[5, 6, 7])
    c = await generate(sglang_double, input_ids=[5, 6, 8])
    assert len(a["output_ids"]) == 128
    assert a["output_ids"] == b["output_ids"] != c["output_ids"]
    assert a["meta_info"]["id"] != b["meta_info"]["id"]  # generated rids


async def test_streaming_chunks_are_cumulative_and_end_with_done(sglang_double):
    async with aiohttp.ClientSession() as http:
        async with http.post(
            sglang_double.url + "/generate",
            json={"rid": "s1", "input_ids": [1, 2], "stream": True, "sampling_params": {"max_new_tokens": 4}},
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = parse_sse(await resp.read())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4]
    for earlier, later in zip(chunks, chunks[1:], strict=False):
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None, None, None]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert chunks[-1]["meta_info"]["id"] == "s1"


async def test_stream_interval_batches_chunks(sglang_double):
    status, text = await post(
        sglang_double.url,
        "/generate",
        {"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 5, "stream_interval": 2}},
    )
    chunks = parse_sse(text)[:-1]
    assert [len(c["output_ids"]) for c in chunks] == [1, 3, 5]  # first at once, then every 2


async def test_eos_stops_generation_and_is_kept_in_output_ids(make_sglang_double):
    double = await make_sglang_double(responder=scripted_responder([10, 11, IM_END_ID, 12, 13]))
    out = await generate(double, input_ids=[1], sampling_params={"max_new_tokens": 50})
    assert out["output_ids"] == [10, 11, IM_END_ID]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END_ID}


async def test_ignore_eos_and_stop_token_ids(make_sglang_double):
    double = await make_sglang_double(responder=scripted_responder([10, IM_END_ID, 12, 13, 14]))
    out = await generate(double, input_ids=[1], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert out["output_ids"] == [10, IM_END_ID, 12, 13]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    out = await generate(double, input_ids=[1], sampling_params={"stop_token_ids": [10]})
    assert out["output_ids"] == [10]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 10}
    out = await generate(
        double, input_ids=[1], sampling_params={"stop_token_ids": [10], "ignore_eos": True, "max_new_tokens": 3}
    )
    assert out["output_ids"] == [10, IM_END_ID, 12]


async def test_async_responder_sees_input_and_params(make_sglang_double):
    seen = []

    async def responder(input_ids, params):
        seen.append((input_ids, params))
        await asyncio.sleep(0)
        return [7, 8, ENDOFTEXT_ID]

    double = await make_sglang_double(responder=responder)
    out = await generate(double, input_ids=[4, 5], sampling_params={"max_new_tokens": 9, "temperature": 0})
    assert out["output_ids"] == [7, 8, ENDOFTEXT_ID]
    assert seen == [([4, 5], {"max_new_tokens": 9, "temperature": 0})]


async def test_requests_are_recorded_with_session_id_and_custom_params(sglang_double):
    body = {
        "input_ids": [1, 2],
        "session_id": "agent-7",
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"lease_ttl_s": 30}},
    }
    await generate(sglang_double, **body)
    assert sglang_double.requests == [body]
    assert sglang_double.results[0]["meta_info"]["completion_tokens"] == 1


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"input_ids": [1], "sampling_params": {"max_tokens": 3}}, "unknown field `max_tokens`"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "3"}}, "invalid type"),
        ({"input_ids": "abc"}, "TokenIdsOrList"),
        ({"input_ids": [1], "session_id": 5}, "expected a string"),
    ],
)
async def test_contract_errors_are_400_with_string_error(sglang_double, body, fragment):
    status, text = await post(sglang_double.url, "/generate", body)
    assert status == 400
    error = json.loads(text)["error"]
    assert isinstance(error, str) and fragment in error


async def test_unknown_top_level_keys_are_ignored(sglang_double):
    out = await generate(sglang_double, input_ids=[1], sampling_params={"max_new_tokens": 1}, whatever=True)
    assert len(out["output_ids"]) == 1


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"text": "hello"}, "cannot accept text prompts"),
        ({}, "Either text, input_ids or input_embeds should be provided."),
        (
            {"input_ids": [1], "session_id": "a", "session_params": {"id": "a"}},
            "session_id and session_params cannot both be set.",
        ),
        ({"input_ids": [1], "sampling_params": {"stop": "\n"}}, "is unavailable when skip_tokenizer_init=True"),
        ({"input_ids": [1], "sampling_params": {"min_new_tokens": 2}}, "min_new_tokens=2 is unavailable"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        ({"input_ids": list(range(50)), "sampling_params": {"max_new_tokens": 60}}, "maximum context length of 100"),
        (
            {"input_ids": list(range(100))},
            "The input (100 tokens) is longer than the model's context length (100 tokens).",
        ),
    ],
)
async def test_semantic_errors_are_400_with_message(make_sglang_double, body, fragment):
    double = await make_sglang_double(context_length=100)
    status, text = await post(double.url, "/generate", body)
    assert status == 400, text
    assert fragment in json.loads(text)["error"]["message"]


async def test_semantic_error_in_stream_is_an_sse_error_event(sglang_double):
    body = {"input_ids": [1], "stream": True, "sampling_params": {"stop": ["x"]}}
    status, text = await post(sglang_double.url, "/generate", body)
    assert status == 200  # SGLang has already started the SSE response
    events = parse_sse(text)
    assert events[-1] == "[DONE]"
    assert events[0]["error"]["type"] == "invalid_request_error"
    assert "skip_tokenizer_init" in events[0]["error"]["message"]


# --------------------------------------------------------------------------- prefix cache


async def test_cached_tokens_grow_across_turns(sglang_double):
    system = list(range(100, 140))
    first = await generate(sglang_double, input_ids=system + [1, 2], sampling_params={"max_new_tokens": 6})
    assert first["meta_info"]["cached_tokens"] == 0
    # Turn 2 = turn-1 prompt + turn-1 output + new tokens: everything committed is cached,
    # i.e. prompt + output minus the last sampled token (its KV was never computed).
    history = system + [1, 2] + first["output_ids"]
    second = await generate(sglang_double, input_ids=history + [3, 4], sampling_params={"max_new_tokens": 6})
    assert second["meta_info"]["cached_tokens"] == len(history) - 1
    assert second["meta_info"]["cached_tokens_details"] == {"device": len(history) - 1, "host": 0}
    # Another conversation sharing only the system prompt.
    other = await generate(sglang_double, input_ids=system + [9], sampling_params={"max_new_tokens": 1})
    assert other["meta_info"]["cached_tokens"] == len(system)


async def test_cached_tokens_never_cover_the_whole_prompt(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    again = await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] == 2


async def test_lru_eviction_under_capacity_pressure(make_sglang_double):
    double = await make_sglang_double(max_total_num_tokens=30)
    a, b = list(range(1000, 1020)), list(range(2000, 2020))
    await generate(double, input_ids=a, sampling_params={"max_new_tokens": 1})
    assert double.cache.size == 20
    await generate(double, input_ids=b, sampling_params={"max_new_tokens": 1})
    assert double.cache.size <= 30
    again_a = await generate(double, input_ids=a + [1], sampling_params={"max_new_tokens": 1})
    assert again_a["meta_info"]["cached_tokens"] < 20  # a's tail was evicted for b
    assert double.cache.evicted_tokens_total > 0


async def test_extra_key_namespaces_are_disjoint(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3, 4], extra_key="a", sampling_params={"max_new_tokens": 1})
    hit = await generate(sglang_double, input_ids=[1, 2, 3, 4, 5], extra_key="a", sampling_params={"max_new_tokens": 1})
    miss = await generate(
        sglang_double, input_ids=[1, 2, 3, 4, 5], extra_key="b", sampling_params={"max_new_tokens": 1}
    )
    assert hit["meta_info"]["cached_tokens"] == 4 and miss["meta_info"]["cached_tokens"] == 0


async def test_flush_cache_and_reset_cache_forget_prefixes(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    async with aiohttp.ClientSession() as http:
        async with http.post(sglang_double.url + "/flush_cache") as resp:
            assert resp.status == 200 and "Cache flushed" in await resp.text()
    out = await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["cached_tokens"] == 0
    sglang_double.reset_cache()
    assert sglang_double.cache.size == 0


def test_prefix_cache_lru_keeps_recently_used_shared_prefix():
    cache = PrefixCache(capacity=10)
    cache.insert([1, 2, 3, 4, 5])
    cache.insert([1, 2, 3, 6, 7])  # shares 1,2,3 -> 7 nodes
    assert cache.size == 7
    cache.match([1, 2, 3, 6, 7])  # touch the second branch
    cache.insert([9, 9, 9, 9])  # 11 nodes -> evict the LRU leaf path (4, 5)
    assert cache.size == 10
    assert cache.match([1, 2, 3, 4, 5]) == 4
    assert cache.match([1, 2, 3, 6, 7]) == 5
    cache.insert(list(range(100, 130)))  # longer than capacity on its own
    assert cache.size <= 10 and cache.evicted_tokens_total > 0


# --------------------------------------------------------------------------- abort & faults


async def test_abort_request_ends_stream_with_abort_finish(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            double.url + "/generate",
            json={"rid": "long", "input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 1000}},
        ) as resp:
            first = await resp.content.readuntil(b"\n\n")
            assert json.loads(first[len(b"data: ") :])["meta_info"]["finish_reason"] is None
            status, _ = await post(double.url, "/abort_request", {"rid": "long"})
            assert status == 200
            events = parse_sse(first + await resp.read())
    final = events[-2]
    assert events[-1] == "[DONE]"
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    assert final["meta_info"]["finish_reason"]["message"] == "Aborted by AbortReq."
    assert 1 <= len(final["output_ids"]) < 1000
    assert double.aborts == [{"rid": "long"}]
    assert double.running_rids == []


async def test_abort_non_streaming_request_returns_partial_output(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    task = asyncio.create_task(generate(double, rid="ns", input_ids=[1], sampling_params={"max_new_tokens": 1000}))
    await double.wait_for_running("ns")
    await asyncio.sleep(0.03)
    await post(double.url, "/abort_request", {"rid": "ns"})
    out = await task
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < out["meta_info"]["completion_tokens"] < 1000


async def test_client_disconnect_mid_stream_is_recorded(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            double.url + "/generate",
            json={"rid": "gone", "input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 1000}},
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()  # hang up
    for _ in range(200):
        if double.client_disconnects:
            break
        await asyncio.sleep(0.01)
    assert double.client_disconnects == ["gone"]
    assert double.running_rids == [] and double.results == []


async def test_abort_unknown_rid_is_a_noop(sglang_double):
    status, text = await post(sglang_double.url, "/abort_request", {"rid": "nope"})
    assert status == 200 and text == ""


async def test_injected_failures_then_recovery(sglang_double):
    sglang_double.faults.fail_next = 2
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 503
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 503
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 200
    assert len(sglang_double.requests) == 3


async def test_connection_dropped_mid_stream(sglang_double):
    sglang_double.faults.drop_next = 1
    sglang_double.faults.drop_after_tokens = 3
    received = b""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            sglang_double.url + "/generate",
            json={"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 10}},
        ) as resp:
            with pytest.raises(aiohttp.ClientError):
                async for line in resp.content:
                    received += line
    chunks = parse_sse(received)
    assert len(chunks) == 3 and "[DONE]" not in chunks
    # Next request is fine again.
    out = await generate(sglang_double, input_ids=[1], sampling_params={"max_new_tokens": 2})
    assert len(out["output_ids"]) == 2


async def test_connection_dropped_non_streaming(sglang_double):
    sglang_double.faults.drop_next = 1
    with pytest.raises(aiohttp.ClientError):
        await post(sglang_double.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})


async def test_first_token_delay(sglang_double):
    sglang_double.faults.first_token_delay = 0.2
    loop = asyncio.get_running_loop()
    start = loop.time()
    await generate(sglang_double, input_ids=[1], sampling_params={"max_new_tokens": 1})
    assert loop.time() - start >= 0.2


async def test_restart_forgets_cache_and_keeps_port(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    url = sglang_double.url
    await sglang_double.restart()
    assert sglang_double.url == url
    out = await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["cached_tokens"] == 0


# --------------------------------------------------------------------------- other routes


async def test_server_info_health_models(sglang_double):
    async with aiohttp.ClientSession() as http:
        async with http.get(sglang_double.url + "/server_info") as resp:
            info = await resp.json()
        assert info["version"] == "0.5.23"
        assert info["skip_tokenizer_init"] is True
        for key in ("model_path", "served_model_name", "tokenizer_path", "max_total_num_tokens", "max_req_input_len"):
            assert key in info
        async with http.get(sglang_double.url + "/health") as resp:
            assert resp.status == 200
        sglang_double.healthy = False
        async with http.get(sglang_double.url + "/health_generate") as resp:
            assert resp.status == 503
        async with http.get(sglang_double.url + "/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == info["served_model_name"]


async def test_sessions_open_close(sglang_double):
    status, text = await post(sglang_double.url, "/open_session", {"capacity_of_str_len": 0, "session_id": "s1"})
    assert status == 200 and json.loads(text) == "s1"
    status, text = await post(sglang_double.url, "/open_session", {"capacity_of_str_len": 0, "session_id": "s1"})
    assert status == 400 and "Failed to open the session" in text
    status, _ = await post(sglang_double.url, "/open_session", {"session_id": "s2"})
    assert status == 400  # capacity_of_str_len is required
    status, text = await post(sglang_double.url, "/close_session", {"session_id": "s1"})
    assert status == 200 and text == ""
    assert sglang_double.closed_sessions == [{"session_id": "s1"}]
    out = await generate(sglang_double, input_ids=[1], session_params={"id": "s1"})
    assert out["meta_info"]["finish_reason"]["type"] == "abort"


async def test_metrics_counters(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 2})
    async with aiohttp.ClientSession() as http:
        async with http.get(sglang_double.url + "/metrics") as resp:
            text = await resp.text()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    model = 'model_name="Qwen/Qwen3-8B"'
    assert values[f"sglang:prompt_tokens_total{{{model}}}"] == 7
    assert values[f"sglang:generation_tokens_total{{{model}}}"] == 4
    assert values[f'sglang:cached_tokens_total{{{model},cache_source="device"}}'] == 3
    assert values[f"sglang:max_total_num_tokens{{{model}}}"] == 200_000


def test_run_in_thread_serves_sync_clients():
    double = SGLangDouble()
    with run_in_thread(double) as url:
        req = urllib.request.Request(
            url + "/generate",
            data=json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            out = json.loads(resp.read())
        assert len(out["output_ids"]) == 3
        double.call_threadsafe(double.restart())
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200

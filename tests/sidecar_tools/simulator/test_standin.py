"""The SGLang stand-in must follow SGLang 0.5.23's HTTP contract, or every sidecar test lies.

Shapes, stop rules and errors are SGLang's (``/work/shared/docs/sglang-0.5.23-internals.md``);
``cached_tokens`` and evictions come from SGLang's own radix cache behind it. The fault and
test controls are checked here too, since the sidecar's robustness tests rely on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request

import aiohttp
import pytest

from sidecar_tools.benchmarks import promtext
from sidecar_tools.simulator.http_contract import parse_sse
from sidecar_tools.simulator.replies import ENDOFTEXT_ID, IM_END_ID, scripted_responder
from sidecar_tools.simulator.server import TIMINGS_PATH
from sidecar_tools.simulator.standin import SGLangStandIn, run_in_thread


async def post(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.text()


async def generate(double: SGLangStandIn, **body) -> dict:
    status, text = await post(double.url, "/generate", body)
    assert status == 200, text
    return json.loads(text)


async def metrics(double: SGLangStandIn) -> dict[str, float]:
    """``/metrics`` samples by bare name (the model_name label dropped; cached tokens: device)."""
    async with aiohttp.ClientSession() as http:
        async with http.get(double.url + "/metrics") as resp:
            samples = promtext.parse(await resp.text())
    out = {}
    for key, value in samples.items():
        name = key.split("{", 1)[0]
        if name != "sglang:cached_tokens_total" or 'cache_source="device"' in key:
            out[name] = value
    return out


@contextlib.asynccontextmanager
async def first_chunk_read(double: SGLangStandIn, max_new_tokens: int):
    """A streamed /generate of ``max_new_tokens`` whose first chunk has been read."""
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": max_new_tokens}}
        async with http.post(double.url + "/generate", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            yield resp


async def stream_chunks(double: SGLangStandIn, body: dict) -> list:
    async with aiohttp.ClientSession() as http:
        async with http.post(double.url + "/generate", json={**body, "stream": True}) as resp:
            assert resp.status == 200
            return parse_sse(await resp.read())


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
    assert meta["e2e_latency"] >= meta["first_token_latency"] >= 0  # --enable-metrics
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


async def test_server_stream_interval_is_the_default_a_request_overrides(make_sglang_double):
    double = await make_sglang_double(stream_interval=3)  # SGLang's --stream-interval 3
    for params, lengths in (({}, [1, 4, 7]), ({"stream_interval": 1}, [1, 2, 3, 4, 5, 6, 7])):
        _, text = await post(double.url, "/generate",
                             {"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 7, **params}})
        assert [len(c["output_ids"]) for c in parse_sse(text)[:-1]] == lengths


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


async def test_a_reply_that_runs_dry_finishes_with_its_length(make_sglang_double):
    double = await make_sglang_double(responder=scripted_responder([10, 11]))
    out = await generate(double, input_ids=[1], sampling_params={"max_new_tokens": 9})
    assert out["output_ids"] == [10, 11] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


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
        ({"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, "invalid type"),
        ({"input_ids": "abc"}, "TokenIdsOrList"),
        ({"input_ids": [1], "session_id": 5}, "expected a string"),
        (["not", "an", "object"], "expected a JSON object"),
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
        ({"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": "b"}}, "Only one of json_schema, regex"),
        ({"input_ids": list(range(50)), "sampling_params": {"max_new_tokens": 60}}, "maximum context length of 100"),
        (
            {"input_ids": list(range(100))},
            "The input (100 tokens) is longer than the model's context length (100 tokens).",
        ),
        ({"input_ids": [[1, 2], [3]]}, "a batch of prompts is not simulated"),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "n > 1 is not simulated"),
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


async def test_a_prompt_the_kv_pool_cannot_hold_is_refused_by_the_scheduler(make_sglang_double):
    """SGLang's scheduler aborts it with status 400: an error object, or in a stream an abort finish."""
    double = await make_sglang_double(max_total_num_tokens=10)
    status, text = await post(double.url, "/generate", {"input_ids": list(range(100, 130))})
    assert status == 400 and "exceeds the maximum allowed length (9 tokens)" in json.loads(text)["error"]["message"]
    events = await stream_chunks(double, {"input_ids": list(range(100, 130))})
    finish = events[0]["meta_info"]["finish_reason"]
    assert events[-1] == "[DONE]" and events[0]["output_ids"] == []
    assert finish["type"] == "abort" and finish["status_code"] == 400 and "maximum allowed length" in finish["message"]


# --------------------------------------------------------------------------- the prefix cache (SGLang's own)


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
    assert (await metrics(double))["sglang:kv_evictable_tokens"] == 20
    await generate(double, input_ids=b, sampling_params={"max_new_tokens": 1})
    again_a = await generate(double, input_ids=a + [1], sampling_params={"max_new_tokens": 1})
    assert again_a["meta_info"]["cached_tokens"] < 20  # a's tail was evicted for b
    assert (await metrics(double))["sglang:evicted_tokens_total"] > 0


async def test_lru_keeps_the_recently_used_branch_and_the_shared_prefix(make_sglang_double):
    double = await make_sglang_double(max_total_num_tokens=10)
    branch_a, branch_b = [1, 2, 3, 4, 5], [1, 2, 3, 6, 7]  # 7 tokens in the tree, 1-2-3 shared
    for ids in (branch_a, branch_b, branch_b):  # the second b touches its branch
        await generate(double, input_ids=ids, sampling_params={"max_new_tokens": 1})
    await generate(double, input_ids=[9, 9, 9, 9], sampling_params={"max_new_tokens": 1})  # needs room
    assert (await metrics(double))["sglang:evicted_tokens_total"] == 2  # a's leaf (4, 5), least recently used
    b_again = await generate(double, input_ids=branch_b + [8], sampling_params={"max_new_tokens": 1})
    a_again = await generate(double, input_ids=branch_a + [8], sampling_params={"max_new_tokens": 1})
    assert b_again["meta_info"]["cached_tokens"] == 5 and a_again["meta_info"]["cached_tokens"] == 3


async def test_extra_key_and_cache_salt_namespaces_are_disjoint(sglang_double):
    for key in ("extra_key", "cache_salt"):
        prompt = [1, 2, 3, 4] if key == "extra_key" else [5, 6, 7, 8]
        await generate(sglang_double, input_ids=prompt, **{key: "a"}, sampling_params={"max_new_tokens": 1})
        hit = await generate(sglang_double, input_ids=prompt + [5], **{key: "a"}, sampling_params={"max_new_tokens": 1})
        miss = await generate(sglang_double, input_ids=prompt + [5], **{key: "b"}, sampling_params={"max_new_tokens": 1})
        assert hit["meta_info"]["cached_tokens"] == 4 and miss["meta_info"]["cached_tokens"] == 0, key


async def test_flush_cache_forgets_prefixes(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    async with aiohttp.ClientSession() as http:
        async with http.post(sglang_double.url + "/flush_cache") as resp:
            assert resp.status == 200 and "Cache flushed" in await resp.text()
    assert (await metrics(sglang_double))["sglang:kv_evictable_tokens"] == 0
    out = await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["cached_tokens"] == 0
    assert sglang_double.flushes == 1


async def test_flush_cache_is_refused_while_a_request_runs(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    task = asyncio.create_task(generate(double, rid="busy", input_ids=[1], sampling_params={"max_new_tokens": 1000}))
    await double.wait_for_running("busy")
    status, text = await post(double.url, "/flush_cache", {})
    assert status == 400 and text == "Flush cache failed.\n"
    await post(double.url, "/abort_request", {"rid": "busy"})
    await task


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
    assert (await metrics(double))["sglang:num_running_reqs"] == 0  # the engine let it go too


async def test_abort_non_streaming_request_returns_partial_output(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    task = asyncio.create_task(generate(double, rid="ns", input_ids=[1], sampling_params={"max_new_tokens": 1000}))
    await double.wait_for_running("ns")
    await asyncio.sleep(0.03)
    await post(double.url, "/abort_request", {"rid": "ns"})
    out = await task
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < out["meta_info"]["completion_tokens"] < 1000
    assert len(out["output_ids"]) == out["meta_info"]["completion_tokens"]


async def test_abort_all(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    tasks = [asyncio.create_task(generate(double, input_ids=[i], sampling_params={"max_new_tokens": 1000})) for i in (1, 2)]
    await double.wait_for_requests(2)
    await _until(lambda: len(double.running_rids) == 2)
    await post(double.url, "/abort_request", {"abort_all": True})
    outs = await asyncio.gather(*tasks)
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort", "abort"]


async def test_client_disconnect_mid_stream_is_recorded(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            double.url + "/generate",
            json={"rid": "gone", "input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": 1000}},
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()  # hang up
    await _until(lambda: bool(double.client_disconnects))
    assert double.client_disconnects == ["gone"]
    assert double.running_rids == [] and double.results == []
    await _until_metric(double, "sglang:num_aborted_requests_total", 1)  # SGLang aborts it


async def test_abort_unknown_rid_is_a_noop(sglang_double):
    status, text = await post(sglang_double.url, "/abort_request", {"rid": "nope"})
    assert status == 200 and text == ""


async def test_injected_failures_then_recovery(sglang_double):
    sglang_double.faults.fail_next = 2
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 503
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 503
    assert (await post(sglang_double.url, "/generate", {"input_ids": [1]}))[0] == 200
    assert len(sglang_double.requests) == 3


async def test_hang_up_before_any_response_line(sglang_double):
    sglang_double.faults.hang_up_next = 1
    with pytest.raises(aiohttp.ClientError):
        await post(sglang_double.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})
    assert sglang_double.requests == []  # nothing was read
    assert len((await generate(sglang_double, input_ids=[1], sampling_params={"max_new_tokens": 2}))["output_ids"]) == 2


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
    assert (await metrics(sglang_double))["sglang:num_running_reqs"] == 0


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


async def test_abort_during_first_token_delay(sglang_double):
    sglang_double.faults.first_token_delay = 5.0
    task = asyncio.create_task(generate(sglang_double, rid="slow", input_ids=[1]))
    await sglang_double.wait_for_running("slow")
    await post(sglang_double.url, "/abort_request", {"rid": "slow"})
    out = await asyncio.wait_for(task, 2)
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "abort"


async def test_token_delay_paces_the_stream(make_sglang_double):
    double = await make_sglang_double(token_delay=0.05)
    async with aiohttp.ClientSession() as http:
        async with http.post(double.url + "/generate", json={"input_ids": [1], "stream": True,
                                                             "sampling_params": {"max_new_tokens": 4}}) as resp:
            arrivals = []
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic())
    assert len(arrivals) == 4
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) >= 0.04  # one step, one token, at the chosen pace
    double.token_delay = 0.0
    started = time.monotonic()
    await generate(double, input_ids=[2], sampling_params={"max_new_tokens": 50})
    assert time.monotonic() - started < 1.0


async def test_freeze_stops_tokens_until_thawed(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    async with first_chunk_read(double, max_new_tokens=20) as resp:
        double.freeze()
        await asyncio.sleep(0.05)  # a step in flight may still land
        resp.content.read_nowait()  # what was sent before
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 0.3)
        assert double.running_rids
        double.thaw()
        events = parse_sse(await asyncio.wait_for(resp.read(), 5))
    assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length"


async def test_restart_forgets_cache_and_keeps_port(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    url = sglang_double.url
    await sglang_double.restart()
    assert sglang_double.url == url
    assert (await metrics(sglang_double))["sglang:num_requests_total"] == 0  # a new process
    out = await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["cached_tokens"] == 0
    assert len(sglang_double.requests) == 2  # the records survive


async def test_restart_drops_a_running_stream(make_sglang_double):
    double = await make_sglang_double(token_delay=0.01)
    async with first_chunk_read(double, max_new_tokens=1000) as resp:
        await double.restart()
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(resp.read(), 3)
    assert double.running_rids == []


async def test_stop_then_start_is_the_same_process(sglang_double):
    await generate(sglang_double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    host, port = sglang_double.host, sglang_double.port
    await sglang_double.stop()
    with pytest.raises(aiohttp.ClientError):
        await post(sglang_double.url, "/generate", {"input_ids": [1]})
    await sglang_double.start(host, port)
    out = await generate(sglang_double, input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["cached_tokens"] == 3


# --------------------------------------------------------------------------- other routes


async def test_server_info_health_models(sglang_double):
    async with aiohttp.ClientSession() as http:
        async with http.get(sglang_double.url + "/server_info") as resp:
            info = await resp.json()
        assert info["version"] == "0.5.23"
        assert info["skip_tokenizer_init"] is True
        for key in ("model_path", "served_model_name", "tokenizer_path", "max_total_num_tokens", "max_req_input_len"):
            assert key in info
        assert info["max_total_num_tokens"] == 200_000 and info["max_req_input_len"] == 40959
        async with http.get(sglang_double.url + "/health") as resp:
            assert resp.status == 200
        sglang_double.healthy = False
        async with http.get(sglang_double.url + "/health_generate") as resp:
            assert resp.status == 503
        async with http.get(sglang_double.url + "/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == info["served_model_name"]


async def test_server_info_overrides_are_what_clients_see(make_sglang_double):
    double = await make_sglang_double(max_total_num_tokens=4096, server_info_overrides={"max_total_num_tokens": 10**8})
    async with aiohttp.ClientSession() as http:
        async with http.get(double.url + "/get_server_info") as resp:
            info = await resp.json()
    assert info["max_total_num_tokens"] == double.max_total_num_tokens == 10**8
    assert info["max_total_tokens"] == 4096  # the pool itself is unchanged


async def test_sessions_open_close(sglang_double):
    status, text = await post(sglang_double.url, "/open_session", {"capacity_of_str_len": 0, "session_id": "s1"})
    assert status == 200 and json.loads(text) == "s1"
    status, text = await post(sglang_double.url, "/open_session", {"capacity_of_str_len": 0, "session_id": "s1"})
    assert status == 400 and "Failed to open the session" in text
    status, _ = await post(sglang_double.url, "/open_session", {"session_id": "s2"})
    assert status == 400  # capacity_of_str_len is required
    status, text = await post(sglang_double.url, "/open_session", {"capacity_of_str_len": 0, "streaming": True})
    assert status == 400 and "--enable-streaming-session" in text
    out = await generate(sglang_double, input_ids=[1], session_params={"id": "s1"}, sampling_params={"max_new_tokens": 2})
    assert out["meta_info"]["finish_reason"]["type"] == "length"  # an open session serves
    status, text = await post(sglang_double.url, "/close_session", {"session_id": "s1"})
    assert status == 200 and text == ""
    assert sglang_double.closed_sessions == [{"session_id": "s1"}]
    # the scheduler refuses a closed (unknown) session: 400 with its message
    status, text = await post(sglang_double.url, "/generate", {"input_ids": [1], "session_params": {"id": "s1"}})
    assert status == 400 and json.loads(text)["error"]["message"] == "Invalid request: session id s1 does not exist"
    events = await stream_chunks(sglang_double, {"input_ids": [1], "session_params": {"id": "s1"}})
    finish = events[0]["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and finish["status_code"] == 400 and events[-1] == "[DONE]"


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


async def test_api_key_guards_every_route_but_probes_and_metrics(make_sglang_double):
    double = await make_sglang_double(api_key="k3y")
    status, text = await post(double.url, "/generate", {"input_ids": [1]})
    assert status == 401 and json.loads(text) == {"error": "Unauthorized"}
    status, _ = await post(double.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}},
                           {"Authorization": "Bearer k3y"})
    assert status == 200
    async with aiohttp.ClientSession() as http:
        for path in ("/health", "/health_generate", "/metrics"):
            assert (await http.get(double.url + path)).status == 200
        assert (await http.get(double.url + "/server_info")).status == 401
    assert [(path, auth) for _, path, auth in double.calls[:2]] == [("/generate", None), ("/generate", "Bearer k3y")]
    assert len(double.requests) == 1  # the refused call never reached /generate


async def test_without_recording_nothing_is_kept_but_timings_when_asked(make_sglang_double):
    double = await make_sglang_double(record=False, record_timings=True, token_delay=0.01)
    await stream_chunks(double, {"input_ids": [1], "session_id": "s", "sampling_params": {"max_new_tokens": 3}})
    await stream_chunks(double, {"input_ids": [2], "session_id": "s", "sampling_params": {"max_new_tokens": 3}})
    assert double.requests == [] and double.results == [] and double.calls == []
    async with aiohttp.ClientSession() as http:
        async with http.get(double.url + TIMINGS_PATH) as resp:
            timings = await resp.json()
    assert len(timings["s"]) == 2
    for received, first, last in timings["s"]:
        assert received < first < last  # the first token after a step, the last two steps later


async def test_without_a_radix_cache_nothing_is_cached_and_streams_still_step(make_sglang_double):
    """``--disable-radix-cache`` (the load test's engine): every prompt computed anew."""
    double = await make_sglang_double(disable_radix_cache=True, token_delay=0.01)
    first = await generate(double, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4})
    again = await generate(double, input_ids=[1, 2, 3, *first["output_ids"], 7], sampling_params={"max_new_tokens": 2})
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert again["meta_info"]["cached_tokens"] == 0 and len(again["output_ids"]) == 2
    chunks = await stream_chunks(double, {"input_ids": [5], "sampling_params": {"max_new_tokens": 3}})
    assert [len(c["output_ids"]) for c in chunks[:-1]] == [1, 2, 3]
    async with aiohttp.ClientSession() as http:
        async with http.get(double.url + "/server_info") as resp:
            assert (await resp.json())["disable_radix_cache"] is True
    task = asyncio.create_task(generate(double, rid="long", input_ids=[1], sampling_params={"max_new_tokens": 1000}))
    await double.wait_for_running("long")
    await post(double.url, "/abort_request", {"rid": "long"})
    assert (await task)["meta_info"]["finish_reason"]["type"] == "abort"
    values = await metrics(double)
    assert values["sglang:prompt_tokens_total"] == 3 + 8 + 1 + 1 and values["sglang:num_running_reqs"] == 0
    with pytest.raises(ValueError):
        SGLangStandIn(disable_radix_cache=True, policy="session_ttl")


def test_run_in_thread_serves_sync_clients():
    double = SGLangStandIn()
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


# --------------------------------------------------------------------------- helpers


async def _until(predicate, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _until_metric(double, name: str, value: float, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while (await metrics(double)).get(name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.01)

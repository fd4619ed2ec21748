"""``simulate --serve``: the simulated engine behind SGLang's HTTP contract, and the sidecar in
front of it end to end (the README's main job on a machine without a GPU)."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

pytest.importorskip("sglang")

import aiohttp

from sidecar_tools.simulator.engine import SimEngine
from sidecar_tools.simulator.server import SimServer, run_in_thread
from sidecar_thread import sidecar_in_thread


async def _stream(http, url, body):
    chunks = []
    async with http.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


async def test_generate_contract_streams_cumulative_ids_and_reports_cache(cost):
    server = SimServer(SimEngine(kv_tokens=20_000, policy="session_ttl", cost=cost), time_scale=20.0)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            info = await (await http.get(f"{url}/server_info")).json()
            assert info["max_total_num_tokens"] == 20_000 and info["max_req_input_len"] > 0
            assert (await http.get(f"{url}/health")).status == 200
            prompt = list(range(1000, 1600))
            body = {"input_ids": prompt, "session_id": "s1", "stream": True,
                    "sampling_params": {"max_new_tokens": 40, "ignore_eos": True,
                                        "custom_params": {"session_lease_ttl_s": 30}}}
            chunks = await _stream(http, url, body)
            ids = [c["output_ids"] for c in chunks]
            assert all(a == b[: len(a)] for a, b in itertools.pairwise(ids))  # cumulative
            final = chunks[-1]["meta_info"]
            assert final["finish_reason"] == {"type": "length", "length": 40}
            assert final["prompt_tokens"] == 600 and final["completion_tokens"] == 40 and final["cached_tokens"] == 0
            assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
            # the next turn resends everything: all of it but the last sampled token is cached
            body2 = {**body, "input_ids": prompt + ids[-1] + list(range(2000, 2100)), "stream": False}
            async with http.post(f"{url}/generate", json=body2) as resp:
                out = await resp.json()
            assert out["meta_info"]["cached_tokens"] == 600 + 40 - 1
            assert server.engine.mgr.snapshot()["hard_leases"] == 1  # the plugin leased it
            # contract errors: text prompt, unknown sampling key (SGLang's schema gate)
            async with http.post(f"{url}/generate", json={"text": "hi"}) as resp:
                assert resp.status == 400 and "input_ids" in (await resp.json())["error"]["message"]
            async with http.post(f"{url}/generate", json={"input_ids": [1], "sampling_params": {"bogus": 1}}) as resp:
                assert resp.status == 400
            assert (await http.post(f"{url}/close_session", json={"session_id": "s1"})).status == 200
            assert server.engine.mgr.snapshot()["hard_leases"] == 0
            # abort a long request mid-stream
            long = {"input_ids": list(range(3000, 3100)), "rid": "long", "stream": True,
                    "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
            task = asyncio.create_task(_stream(http, url, long))
            await asyncio.sleep(0.3)
            assert (await http.post(f"{url}/abort_request", json={"rid": "long"})).status == 200
            chunks = await asyncio.wait_for(task, 10)
            assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
            assert (await http.post(f"{url}/flush_cache")).status == 200
            metrics = await (await http.get(f"{url}/metrics")).text()
            assert "sglang:cached_tokens_total" in metrics and "sglang:max_total_num_tokens" in metrics
    finally:
        await server.stop()


def test_the_sidecar_runs_end_to_end_against_the_simulated_engine(cost, qwen3_tokenizer_dir):
    from openai import OpenAI

    from sidecar.settings import load_settings

    server = SimServer(SimEngine(kv_tokens=40_000, policy="session_ttl", cost=cost), time_scale=20.0)
    with run_in_thread(server) as engine_url:
        settings = load_settings(overrides={
            "server": {"sglang_url": engine_url, "tokenizer": str(qwen3_tokenizer_dir)},
            "policy": {"mode": "fixed", "fixed_ttl": 30.0},
        })
        with sidecar_in_thread(settings) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            messages = [{"role": "system", "content": "You are a careful coding agent."},
                        {"role": "user", "content": "Find the bug in main.py. " * 20}]
            usages = []
            model = client.models.list().data[0].id
            for turn in range(2):
                reply = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                                       extra_headers={"X-Session-Id": "agent-1"})
                usages.append(reply.usage)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": "The tests still fail: " + "x = 1\n" * 30})
            first, second = usages
            assert first.completion_tokens == 12
            assert second.prompt_tokens_details.cached_tokens > first.prompt_tokens_details.cached_tokens
            # token-exact continuation: everything the engine held after turn 1 is reused
            assert second.prompt_tokens_details.cached_tokens >= first.prompt_tokens + first.completion_tokens - 1
            snap = server.engine.mgr.snapshot()
            assert snap["metrics"]["grants"] == 2  # the sidecar's fixed lease reached the plugin

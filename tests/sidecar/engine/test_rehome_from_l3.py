"""A lost worker's sessions move on; where the workers share HiCache's L3 storage tier (SGLang's
``--hicache-storage-backend file`` on a shared path, here ``SharedStorage``), the new worker reads
their history back instead of recomputing it, and the sidecar counts which of the two happened."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from sidecar.server.app import create_app
from sidecar.settings import load_settings
from sidecar_tools.simulator.standin_storage import SharedStorage
from sidecar_tools.simulator.standin import SGLangStandIn

openai = pytest.importorskip("openai")

AGENTS = 4


async def _metrics(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("sidecar_rehomed")}


async def _run(tokenizer, l3: SharedStorage | None):
    """AGENTS agents over two workers; the worker of agent-0 is killed after turn 2; each agent
    then runs two more turns. Returns (cached tokens of each moved agent's first turn after the
    kill, the history it sent then, its next turn's cached and history, the sidecar's metrics)."""
    sims = {}
    for _ in range(2):
        sim = SGLangStandIn(max_total_num_tokens=60_000, policy="session_ttl", model_path="qwen3", l3=l3)
        sims[await sim.start()] = sim
    settings = load_settings(overrides={"server": {"worker_urls": " ".join(sims), "startup_wait": 10}})
    runner = web.AppRunner(create_app(settings, tokenizer=tokenizer))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
    try:
        model = (await client.models.list()).data[0].id
        chats = {f"agent-{i}": [{"role": "system", "content": "You are an agent."},
                                {"role": "user", "content": f"task {i}: " + "read the repository " * (20 + i)}]
                 for i in range(AGENTS)}

        async def turn(name: str, n: int):
            for _ in range(3):
                try:
                    reply = await client.chat.completions.create(
                        model=model, messages=chats[name], max_tokens=8, extra_headers={"X-Session-Id": name})
                    break
                except (openai.APIStatusError, openai.APIConnectionError):
                    continue  # its worker was lost under it: the retry goes to another
            else:
                raise AssertionError(f"{name} turn {n} never went through")
            chats[name] += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                            {"role": "user", "content": f"tool result {n} " + "output line " * 10}]
            return reply.usage.prompt_tokens_details.cached_tokens, reply.usage.prompt_tokens

        for n in range(2):
            for name in chats:
                await turn(name, n)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/sessions") as r:
                worker_of = {s["id"]: s["worker"] for s in (await r.json())["data"]}
        victim = worker_of["agent-0"]
        moved = [name for name in chats if worker_of[name] == victim]
        await sims[victim].stop()
        after = {name: [await turn(name, n) for n in (2, 3)] for name in chats}
        return moved, after, await _metrics(base)
    finally:
        await runner.cleanup()
        for sim in sims.values():
            await sim.stop()


async def test_a_moved_session_is_read_back_from_shared_l3_not_recomputed(qwen3_tokenizer):
    l3 = SharedStorage()
    moved, after, metrics = await _run(qwen3_tokenizer, l3)
    for name in moved:
        (cached, prompt), (next_cached, next_prompt) = after[name]
        assert prompt - cached < 60  # only the turn's new messages were computed, not the history
        assert next_prompt - next_cached < 60  # and it lives on its new worker from then on
    assert l3.reads >= len(moved)
    restored = metrics["sidecar_rehomed_restored_tokens_total"]
    assert restored > 100 * len(moved) and metrics["sidecar_rehomed_recompute_tokens_total"] <= len(moved)


async def test_without_shared_storage_a_moved_session_is_recomputed_and_counted(qwen3_tokenizer):
    moved, after, metrics = await _run(qwen3_tokenizer, None)
    for name in moved:
        (cached, prompt), (next_cached, next_prompt) = after[name]
        assert cached < 20  # at most the system prompt another session left on the new worker
        assert next_prompt - next_cached < 60  # the recompute happened once; from then on it is cached there
    recomputed = metrics["sidecar_rehomed_recompute_tokens_total"]
    assert recomputed > 100 * len(moved) and metrics["sidecar_rehomed_restored_tokens_total"] < 20 * len(moved)

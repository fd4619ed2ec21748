"""smg names the worker that took each request (``x-smg-routed-worker-id``); the sidecar checks it.

A gateway stand-in in front of two simulated workers answers like smg 1.13 (the target header is
an index into its available workers, the answer names the worker), except that a test can make
its index point elsewhere, as happens in the moment after smg's available set changed and before
the sidecar re-read the listing, or fail a request over from a worker that died. A request sent
elsewhere once is stopped there before any output and sent again; one that keeps landing elsewhere is
served there and the session moves, counted; one smg failed over from a worker it no longer lists is
served where it landed, with no error and nothing stopped.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from sidecar.engine.smg import ROUTED_WORKER_HEADER, TARGET_WORKER_HEADER
from sidecar.server.app import create_app
from sidecar.settings import load_settings
from sidecar_tools.simulator.standin import SGLangStandIn

openai = pytest.importorskip("openai")


class ShiftingGateway:
    """smg's routing by target index, with ``shift`` requests sent to the next worker instead."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.shift = 0  # how many of the next requests smg sends to the wrong worker
        self.always_shift = False
        self.fail_over_from: str | None = None  # a worker that dies at its next request: smg fails it over
        self.down: set[str] = set()  # listed unhealthy
        self.listings = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/workers", self._workers)
        app.router.add_post("/generate", self._generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def _workers(self, request: web.Request) -> web.Response:
        self.listings += 1
        return web.json_response({"workers": [{"url": u, "is_healthy": u not in self.down} for u in self.urls]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        index = int(request.headers[TARGET_WORKER_HEADER])
        if self.shift or self.always_shift:
            self.shift = max(self.shift - 1, 0)
            index = (index + 1) % len(self.urls)
        url = self.urls[index]
        if url == self.fail_over_from:  # the request to it fails: smg lists it unhealthy, retries on another
            self.down.add(url)
            url = next(u for u in self.urls if u not in self.down)
        body = await request.read()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/generate", data=body, headers={"Content-Type": "application/json"}) as up:
                out = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream", ROUTED_WORKER_HEADER: url})
                await out.prepare(request)
                try:
                    async for chunk in up.content.iter_any():
                        await out.write(chunk)
                except (ConnectionResetError, aiohttp.ClientError):
                    pass  # the sidecar hung up: smg drops the upstream request too
                return out


async def _sidecar(smg_url: str, tokenizer):
    settings = load_settings(overrides={"server": {"smg_url": smg_url, "startup_wait": 10}})
    runner = web.AppRunner(create_app(settings, tokenizer=tokenizer))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _setup(tokenizer):
    sims = {}
    for _ in range(2):
        sim = SGLangStandIn(max_total_num_tokens=60_000, policy="session_ttl", model_path="qwen3")
        sims[await sim.start()] = sim
    gateway = ShiftingGateway(list(sims))
    runner, base = await _sidecar(await gateway.start(), tokenizer)
    return sims, gateway, runner, base


async def _teardown(sims, gateway, runner):
    await runner.cleanup()
    await gateway.stop()
    for sim in sims.values():
        await sim.stop()


class Agent:
    def __init__(self, base: str, name: str):
        self.client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
        self.name = name
        self.messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"task {name}"}]
        self.history_tokens = 0  # what the next turn should find cached on the session's worker

    async def turn(self, n: int):
        model = (await self.client.models.list()).data[0].id
        reply = await self.client.chat.completions.create(
            model=model, messages=self.messages, max_tokens=6, extra_headers={"X-Session-Id": self.name})
        self.messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                          {"role": "user", "content": f"tool result {n}"}]
        cached = reply.usage.prompt_tokens_details.cached_tokens
        self.history_tokens = reply.usage.prompt_tokens + reply.usage.completion_tokens - 1
        self.sent_tokens = reply.usage.prompt_tokens + reply.usage.completion_tokens  # what the next turn resends
        return reply, cached


async def _session(base: str, name: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/sessions") as r:
            return {s["id"]: s for s in (await r.json())["data"]}[name]


async def _metric(base: str, name: str) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def _rids(sim: SGLangStandIn, session: str) -> list[str]:
    return [r["rid"] for r in sim.generate_requests() if isinstance(r, dict) and r.get("session_id") == session]


@pytest.fixture
async def routed(qwen3_tokenizer):
    """Two workers behind the shifting gateway, the sidecar in front: (sims, gateway, base URL)."""
    sims, gateway, runner, base = await _setup(qwen3_tokenizer)
    try:
        yield sims, gateway, base
    finally:
        await _teardown(sims, gateway, runner)


async def _placed_agent(base: str, sims: dict, name: str) -> tuple[Agent, str, str]:
    """An agent after its first turn, its session's worker, and the other worker."""
    agent = Agent(base, name)
    await agent.turn(0)
    home = (await _session(base, name))["worker"]
    return agent, home, next(u for u in sims if u != home)


async def test_a_request_smg_sends_elsewhere_is_stopped_there_and_sent_again(routed):
    sims, gateway, base = routed
    agent, home, other = await _placed_agent(base, sims, "agent-a")
    expected = agent.history_tokens
    listings = gateway.listings

    gateway.shift = 1  # smg's index points at the other worker for one request
    _, cached = await agent.turn(1)

    assert cached == expected  # served on its own worker after all: its history was there
    assert (await _session(base, "agent-a"))["worker"] == home
    stray = _rids(sims[other], "agent-a")
    assert len(stray) == 1 and stray[0] in {a["rid"] for a in sims[other].aborts}  # stopped there
    assert [r for r in _rids(sims[home], "agent-a") if r.startswith(stray[0])]  # sent again to its worker
    assert gateway.listings > listings  # after re-reading smg's listing
    assert await _metric(base, "sidecar_turns_served_elsewhere_total") == 0


async def test_a_turn_smg_keeps_serving_elsewhere_moves_the_session_and_is_counted(routed, caplog):
    sims, gateway, base = routed
    agent, home, other = await _placed_agent(base, sims, "agent-b")
    history = agent.sent_tokens

    gateway.always_shift = True  # the sidecar's re-read listing does not help: smg still sends it elsewhere
    with caplog.at_level(logging.WARNING, logger="sidecar.engine"):
        await agent.turn(1)
    gateway.always_shift = False

    session = await _session(base, "agent-b")
    assert session["worker"] == other and session["rehomed"] == 1  # its KV is there now
    assert await _metric(base, "sidecar_turns_served_elsewhere_total") == 1
    # the listing never changed: what smg's circuit breaker does, and the operator is told the flag
    assert sum("--disable-circuit-breaker" in r.getMessage() for r in caplog.records) == 1
    # its whole history went to a worker that did not hold it: counted as recomputed
    assert await _metric(base, "sidecar_rehomed_recompute_tokens_total") == history

    expected = agent.history_tokens
    _, cached = await agent.turn(2)  # the next turn goes where the KV now is
    assert cached == expected
    assert len(_rids(sims[other], "agent-b")) == 3  # turn 1 twice (both landed there), turn 2


async def test_a_request_smg_fails_over_from_a_dead_worker_is_served_where_it_landed(routed):
    sims, gateway, base = routed
    agent, home, other = await _placed_agent(base, sims, "agent-c")
    history = agent.sent_tokens

    gateway.fail_over_from = home  # the session's worker dies as its next turn arrives
    await agent.turn(1)  # no error reaches the client

    session = await _session(base, "agent-c")
    assert session["worker"] == other and session["rehomed"] == 1  # its KV is where smg served the turn
    assert len(_rids(sims[other], "agent-c")) == 1 and sims[other].aborts == []  # served once, nothing stopped
    assert await _metric(base, "sidecar_turns_served_elsewhere_total") == 1
    assert await _metric(base, "sidecar_rehomed_recompute_tokens_total") == history

    expected = agent.history_tokens
    _, cached = await agent.turn(2)  # the next turn goes where the KV now is
    assert cached == expected and len(_rids(sims[other], "agent-c")) == 2

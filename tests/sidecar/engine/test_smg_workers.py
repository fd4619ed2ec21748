"""Several simulated SGLang workers behind a real smg process, the sidecar in front, the official
openai client driving 20 agents x 16 turns: every turn reaches the worker holding its session's
KV (the engine reports the whole history cached), new sessions are spread by footprint, a worker
killed mid-run loses only its in-flight requests (its sessions continue elsewhere, re-homed and
counted), and a worker added to smg at runtime takes new sessions."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections import Counter

import aiohttp
import pytest
from aiohttp import web

from sidecar.server.app import create_app
from sidecar.settings import load_settings
from sidecar_tools.simulator.standin import SGLangStandIn

openai = pytest.importorskip("openai")
SMG = shutil.which("smg")
pytestmark = pytest.mark.skipif(SMG is None, reason="the smg binary is not installed (pip install smg==1.13.0)")

AGENTS, TURNS, KILL_AT_TURN = 20, 16, 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_listing(http: aiohttp.ClientSession, smg_url: str, healthy: int) -> list[dict]:
    for _ in range(200):
        try:
            async with http.get(f"{smg_url}/workers") as r:
                workers = (await r.json()).get("workers", [])
            if sum(w.get("is_healthy", False) for w in workers) == healthy:
                return workers
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"smg never listed {healthy} healthy workers")


def _sessions_by_worker(sims: dict[str, SGLangStandIn]) -> dict[str, set[str]]:
    return {url: {r["session_id"] for r in sim.generate_requests() if isinstance(r, dict)} for url, sim in sims.items()}


def _served_turns(sim: SGLangStandIn) -> Counter:
    """How many requests of each session this worker finished for the sidecar. A request the sidecar
    sent /abort_request for is not one, even when it finished before the abort arrived: smg's own
    retry of a request in flight on the killed worker may land anywhere, and the sidecar stops it and
    discards what it answered."""
    session_of = {r["rid"]: r["session_id"] for r in sim.generate_requests() if isinstance(r, dict)}
    aborted = {str(body.get("rid")) for body in sim.aborts if isinstance(body, dict)}
    return Counter(session_of[rid] for res in sim.results
                   if (rid := res["meta_info"]["id"]) in session_of and rid not in aborted
                   and (res["meta_info"].get("finish_reason") or {}).get("type") != "abort")


def _served_sessions_by_worker(sims: dict[str, SGLangStandIn]) -> dict[str, set[str]]:
    return {url: set(_served_turns(sim)) for url, sim in sims.items()}


async def test_agents_keep_their_worker_through_smg_and_move_when_it_dies(qwen3_tokenizer, tmp_path):
    sims = {}
    for _ in range(3):
        sim = SGLangStandIn(max_total_num_tokens=60_000, policy="session_ttl", model_path="qwen3")
        sims[await sim.start()] = sim
    urls = list(sims)
    smg_port = _free_port()
    smg_url = f"http://127.0.0.1:{smg_port}"
    smg = subprocess.Popen(
        [SMG, "launch", "--worker-urls", *urls, "--policy", "consistent_hashing", "--port", str(smg_port),
         "--prometheus-port", str(_free_port()), "--log-level", "warn", "--health-check-interval-secs", "1",
         "--health-failure-threshold", "1", "--disable-circuit-breaker", "--retry-max-retries", "1", "--retry-initial-backoff-ms", "50"],
        stdout=open(tmp_path / "smg.log", "w"), stderr=subprocess.STDOUT,
    )
    runner = None
    try:
        async with aiohttp.ClientSession() as http:
            await _wait_listing(http, smg_url, 3)
            settings = load_settings(overrides={"server": {"smg_url": smg_url, "startup_wait": 10}})
            runner = web.AppRunner(create_app(settings, tokenizer=qwen3_tokenizer))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
            model = (await client.models.list()).data[0].id

            progress = Counter()
            failures = Counter()
            not_cached = []

            async def agent(name: str, turns: int) -> None:
                messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"task {name}"}]
                expected_cached = None
                for turn in range(turns):
                    for attempt in range(5):
                        try:
                            reply = await client.chat.completions.create(
                                model=model, messages=messages, max_tokens=6, extra_headers={"X-Session-Id": name})
                            break
                        except (openai.APIStatusError, openai.APIConnectionError) as exc:
                            failures[getattr(exc, "status_code", "connection")] += 1
                            expected_cached = None  # its worker may be gone: a recompute is allowed
                            await asyncio.sleep(0.2)
                    else:
                        raise AssertionError(f"{name} turn {turn} never went through")
                    cached = reply.usage.prompt_tokens_details.cached_tokens
                    if expected_cached is not None and cached != expected_cached:
                        not_cached.append((name, turn, cached, expected_cached))
                    expected_cached = reply.usage.prompt_tokens + reply.usage.completion_tokens - 1
                    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                                 {"role": "user", "content": f"tool result {turn}"}]
                    progress[name] += 1

            async def sessions() -> dict[str, dict]:
                async with http.get(f"{base}/v1/sessions") as r:
                    return {s["id"]: s for s in (await r.json())["data"]}

            tasks = [asyncio.create_task(agent(f"agent-{i}", TURNS)) for i in range(AGENTS)]
            while min(progress.values(), default=0) < KILL_AT_TURN:
                await asyncio.sleep(0.05)
            before = await sessions()
            placed = Counter(s["worker"] for s in before.values())
            assert len(placed) == 3 and max(placed.values()) - min(placed.values()) <= 1, placed  # spread by footprint
            # affinity so far: each session's requests reached exactly one worker, the one the sidecar names
            seen = _sessions_by_worker(sims)
            for sid, s in before.items():
                assert [u for u, ids in seen.items() if sid in ids] == [s["worker"]], sid

            victim = max(placed, key=placed.get)
            await sims[victim].stop()  # killed mid-run: in-flight requests fail, its sessions move
            await asyncio.wait_for(asyncio.gather(*tasks), 90)
            # a session whose last turn the victim finished while it was being stopped had nothing left to move
            done_before_kill = {sid for sid, n in _served_turns(sims[victim]).items() if n >= TURNS}
            after = await sessions()
            moved = [sid for sid, s in before.items() if s["worker"] == victim]
            kept = [sid for sid in before if sid not in moved]
            assert [(sid, after[sid]) for sid in kept if after[sid]["worker"] != before[sid]["worker"]] == []
            survivors = [u for u in urls if u != victim]
            seen_after = _served_sessions_by_worker({u: sims[u] for u in survivors})
            for sid in set(moved) - done_before_kill:  # each lives on one surviving worker, which served its turns
                assert after[sid]["worker"] in survivors and after[sid]["rehomed"] >= 1, (sid, after[sid])
                assert [u for u, ids in seen_after.items() if sid in ids] == [after[sid]["worker"]], sid
            assert all(progress[f"agent-{i}"] == TURNS for i in range(AGENTS))
            # apart from a re-homed session's first turn elsewhere, every turn found its history cached
            assert {name for name, *_ in not_cached} <= set(moved), not_cached
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
            rehomed = sum(s["rehomed"] for s in after.values())
            assert rehomed >= 1 and f"sidecar_sessions_rehomed_total {float(rehomed)}" in text
            assert 'sidecar_worker_sessions{worker="' in text and "sidecar_worker_admissions_total" in text

            # a worker added to smg at runtime takes new sessions
            new = SGLangStandIn(max_total_num_tokens=60_000, policy="session_ttl", model_path="qwen3")
            new_url = await new.start()
            sims[new_url] = new
            async with http.post(f"{smg_url}/workers", json={"url": new_url}) as r:
                assert r.status < 300, await r.text()
            await _wait_listing(http, smg_url, 3)
            for _ in range(100):
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                    if f'sidecar_worker_sessions{{worker="{new_url}"}}' in text:
                        break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # its capacity read
            late_names = [f"late-{i}" for i in range(6)]
            await asyncio.gather(*(agent(name, 3) for name in late_names))
            late = await sessions()
            assert all(late[name]["turns"] == 3 for name in late_names)
            # it joined the placement: the new sessions are spread by footprint over the usable
            # workers, the new one included, and their requests reach the worker each is placed on
            placed_late = Counter(late[name]["worker"] for name in late_names)
            assert set(placed_late) == {*survivors, new_url} and max(placed_late.values()) <= 3, (placed_late, new_url)
            seen_late = _served_sessions_by_worker({u: sims[u] for u in survivors + [new_url]})
            for name in late_names:
                assert [u for u, ids in seen_late.items() if name in ids] == [late[name]["worker"]], name
            await new.stop()
    finally:
        if runner is not None:
            await runner.cleanup()
        smg.terminate()
        smg.wait(10)
        for sim in sims.values():
            await sim.stop()

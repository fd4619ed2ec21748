"""A tiny stand-in for SGLang (streamed /generate, /v1/chat/completions, /metrics, /close_session).

Its prefix cache keeps whole sequences and evicts the least recently used ones past a token
capacity: crude, but it makes ``cached_tokens`` depend on history and pressure the way the
replay's recompute metric expects. Also runnable for a manual smoke test:
``python tests/sidecar_tools/benchmarks/fake_engine.py --port 30001``.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

from aiohttp import web

KNOWN_SAMPLING = {"max_new_tokens", "ignore_eos", "temperature", "top_p", "custom_params"}


class PrefixCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.seqs: OrderedDict[tuple, None] = OrderedDict()

    def match(self, ids: list[Any]) -> int:
        best, hit = 0, None
        for seq in self.seqs:
            n = 0
            for a, b in zip(seq, ids):
                if a != b:
                    break
                n += 1
            if n > best:
                best, hit = n, seq
        if hit is not None:
            self.seqs.move_to_end(hit)
        return best

    def insert(self, ids: list[Any]) -> None:
        self.seqs[tuple(ids)] = None
        self.seqs.move_to_end(tuple(ids))
        while sum(len(s) for s in self.seqs) > self.capacity and len(self.seqs) > 1:
            self.seqs.popitem(last=False)


class FakeEngine:
    def __init__(self, capacity: int = 1_000_000, token_delay_s: float = 0.0, fail_every: int = 0,
                 tool_calls: bool = False):
        self.cache = PrefixCache(capacity)
        self.tool_calls = tool_calls
        self.token_delay_s = token_delay_s
        self.fail_every = fail_every
        self.requests: list[dict[str, Any]] = []
        self.closed: list[str] = []
        self.prompt_total = 0
        self.cached_total = 0
        self.app = web.Application()
        self.app.add_routes([
            web.post("/generate", self.generate), web.post("/v1/chat/completions", self.chat),
            web.get("/metrics", self.metrics), web.post("/close_session", self.close_session),
            web.get("/v1/models", self.models), web.post("/flush_cache", self.flush),
        ])

    def _fail(self) -> bool:
        return bool(self.fail_every) and len(self.requests) % self.fail_every == 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        sampling = body.get("sampling_params") or {}
        unknown = set(sampling) - KNOWN_SAMPLING
        if unknown:
            return web.json_response({"error": f"unknown sampling params {sorted(unknown)}"}, status=400)
        if self._fail():
            return web.json_response({"error": "injected failure"}, status=500)
        ids = body["input_ids"]
        cached = self.cache.match(ids)
        n = int(sampling.get("max_new_tokens", 128))
        output = [(sum(ids[-3:]) + i) % 50000 + 7 for i in range(n)]
        self.cache.insert(ids + output)
        self.prompt_total += len(ids)
        self.cached_total += cached
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, n, 4):
            await asyncio.sleep(self.token_delay_s)
            meta = {"prompt_tokens": len(ids), "cached_tokens": cached, "completion_tokens": min(n, i + 4),
                    "finish_reason": {"type": "length", "length": n} if i + 4 >= n else None}
            chunk = {"output_ids": output[: i + 4], "meta_info": meta}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({**body, "headers": dict(request.headers)})
        if self._fail():
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        words = [w for m in body["messages"] for w in (f"<{m['role']}>", *str(m.get("content") or "").split())]
        cached = self.cache.match(words)
        n = int(body.get("max_tokens", 16))
        reply = " ".join(f"w{(len(words) + i) % 97}" for i in range(n))
        self.cache.insert(words + ["<assistant>", *reply.split()])
        self.prompt_total += len(words)
        self.cached_total += cached
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in (reply[: len(reply) // 2], reply[len(reply) // 2:]):
            await asyncio.sleep(self.token_delay_s)
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if self.tool_calls:
            call = {"index": 0, "id": f"call_{len(self.requests)}",
                    "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}}
            chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(words), "completion_tokens": n, "total_tokens": len(words) + n,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{model_name="fake"}} {self.prompt_total}\n'
            f'sglang:cached_tokens_total{{cache_source="total",model_name="fake"}} {self.cached_total}\n'
            f'sglang:num_running_reqs{{model_name="fake"}} 0\n'
            "python_gc_objects_collected_total 5\n"
        )
        return web.Response(text=text)

    async def close_session(self, request: web.Request) -> web.Response:
        self.closed.append((await request.json())["session_id"])
        return web.json_response({"success": True})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def flush(self, request: web.Request) -> web.Response:
        self.cache.seqs.clear()
        return web.Response(text="ok")


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=30001)
    p.add_argument("--capacity", type=int, default=173200)
    p.add_argument("--token-delay", type=float, default=0.002)
    a = p.parse_args()
    web.run_app(FakeEngine(a.capacity, a.token_delay).app, host="127.0.0.1", port=a.port)

"""The floor of the load test: a bare Python relay of SGLang's native ``/generate``.

It parses the agent's body, forwards it to SGLang, and streams each chunk back after parsing and
re-serializing it (what any relay that looks at the stream does): no validation, sessions, chat
template, tokenizer or policy. Its CPU per turn is the cost of the second HTTP hop alone, on the
sidecar's own stack (aiohttp server + client, uvloop when installed, pydantic-core JSON), which the
load test puts beside the sidecar's and smg's (``--mode bare``):

    python -m sidecar_tools.benchmarks.bare_relay --sglang-url http://127.0.0.1:30000 --port 8100

Benchmark-only. It takes (and ignores) the rest of ``sidecar serve``'s flags, so it can also stand
in for the sidecar through ``LOAD_TEST_SIDECAR_LAUNCH``.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web
from pydantic_core import from_json, to_json


def relay_app(upstream: str) -> web.Application:
    app = web.Application()
    state: dict[str, aiohttp.ClientSession] = {}

    async def start(_app):
        state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))

    async def stop(_app):
        await state["http"].close()

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def generate(request: web.Request) -> web.StreamResponse:
        payload = from_json(await request.read())
        async with state["http"].post(upstream + "/generate", data=to_json(payload),
                                      headers={"Content-Type": "application/json"}) as upstream_resp:
            if upstream_resp.status != 200:
                return web.Response(status=upstream_resp.status, body=await upstream_resp.read(), content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            partial = b""
            async for chunk in upstream_resp.content.iter_any():
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                out = []
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    out.append(b"data: [DONE]\n\n" if data == b"[DONE]" else b"data: " + to_json(from_json(data)) + b"\n\n")
                if out:
                    await response.write(b"".join(out))
            await response.write_eof()
            return response

    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="serve")  # as `sidecar serve`
    parser.add_argument("--sglang-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args, _ignored = parser.parse_known_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as the sidecar's --event-loop auto
    except ImportError:
        pass
    web.run_app(relay_app(args.sglang_url.rstrip("/")), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()

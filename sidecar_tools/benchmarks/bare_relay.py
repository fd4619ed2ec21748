"""The floor of the load test: the sidecar app with its chat handler replaced by a bare relay.

The relay reads the body, posts a canned prompt of 2,500 ids to SGLang under the agent's session
id and turns each streamed chunk into a one-token SSE frame: no validation, sessions, chat
template, tokenizer or policy. What the load test measures for it is the cost of the second HTTP
hop alone (aiohttp server + aiohttp client, middlewares included), to compare with the sidecar:

    LOAD_TEST_SIDECAR_LAUNCH="python -m sidecar_tools.benchmarks.bare_relay" \\
        python -m sidecar_tools.benchmarks.load_test --sessions 100 --duration 30 --sidecar-arg=--session-idle-grace=10 ...

Benchmark-only: it answers every request with the same canned reply text.
"""

from __future__ import annotations

import json
import sys
import uuid

from aiohttp import web

import sidecar.server.routes
from sidecar.server import keys

_CANNED_IDS = json.dumps([9] * 2500).encode()
_FRAME = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
_LAST = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":2500}}\n\ndata: [DONE]\n\n'


async def bare_relay(request: web.Request) -> web.StreamResponse:
    await request.read()
    sid = json.dumps(request.headers.get("X-Session-Id", "bare")).encode()
    payload = (b'{"input_ids":' + _CANNED_IDS + b',"rid":"' + uuid.uuid4().hex.encode() + b'","session_id":' + sid
               + b',"stream":true,"sampling_params":{"max_new_tokens":64}}')
    (worker,) = request.app[keys.WORKERS]
    engine = worker.client
    upstream = await engine._open("POST", "/generate", data=payload, headers=engine._json_headers)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    try:
        async for chunk in upstream.content.iter_any():
            if not response.prepared:
                await response.prepare(request)
            frames = [_FRAME for line in chunk.split(b"\n") if line.startswith(b"data: {")]
            if frames:
                await response.write(b"".join(frames))
        await response.write_eof(_LAST)
    finally:
        upstream.release()
    return response


def main() -> None:
    sidecar.server.routes.chat_completions = bare_relay  # the app factory registers the route by module name
    sys.argv[0] = "sidecar"
    from sidecar.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

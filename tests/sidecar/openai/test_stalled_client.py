"""A streaming client that stops reading is cut after the write timeout, and its SGLang
request is aborted: it cannot hold a turn (nor the engine's work) forever."""

from __future__ import annotations

import asyncio
import json
import socket

from sidecar_tools.simulator.replies import scripted_responder



async def test_a_client_that_stops_reading_is_cut_and_its_request_aborted(make_sidecar, make_sglang_double, qwen3_tokenizer):
    # 16 tokens a chunk (SGLang's --stream-interval 16): the bytes, not the chunk count, fill the buffers
    double = await make_sglang_double(context_length=131072, stream_interval=16)
    wide = qwen3_tokenizer.encode(" " * 128, add_special_tokens=False)
    assert len(wide) == 1
    double.responder = scripted_responder(wide * 120_000)  # 15 MB of text: more than any socket buffer, however framed
    client = await make_sidecar(double=double, stream_write_timeout=0.5)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (client.server.host, client.server.port))
    body = json.dumps({"messages": [{"role": "user", "content": "talk"}], "stream": True, "max_tokens": 120_000}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode())
    await asyncio.get_running_loop().sock_sendall(sock, head + body)
    try:  # ... and never read
        for _ in range(1200):  # the stand-in makes ~1,500 tokens a second here: ~3 MB fill the buffers in 10-15 s
            if double.aborts:
                break
            await asyncio.sleep(0.05)
        assert [a["rid"] for a in double.aborts] == [double.requests[0]["rid"]]
        assert double.results == [] or double.results[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        sock.close()
    # the sidecar goes on serving
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert resp.status == 200

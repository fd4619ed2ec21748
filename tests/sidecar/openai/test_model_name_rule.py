"""One model-name rule on all three doors: ``model`` is the served id (as /v1/models lists it) or
absent; anything else, a NUL or a megabyte of text included, is a 404 ``model_not_found`` in the
door's own envelope, with the name shown escaped and cut short; ``--accept-any-model`` accepts any
name. While no engine has named its model, /v1/models and the doors answer 503 (retry), not a
placeholder id that a client would then send and get 404s for."""

from __future__ import annotations

import pytest
from aiohttp import web

HI = [{"role": "user", "content": "hi"}]
DOORS = {
    "/v1/chat/completions": lambda model: {"model": model, "messages": HI, "max_tokens": 5},
    "/v1/messages": lambda model: {"model": model, "messages": HI, "max_tokens": 5},
    "/v1/messages/count_tokens": lambda model: {"model": model, "messages": HI},
    "/v1/responses": lambda model: {"model": model, "input": "hi", "max_output_tokens": 5},
}


def _message(path: str, body: dict) -> str:
    return body["error"]["message"]


@pytest.mark.parametrize("path", list(DOORS))
@pytest.mark.parametrize("model", ["gpt-4o", "bad\x00name", "m" * 1_000_000])
async def test_a_model_it_does_not_serve_is_a_404_on_every_door(make_sidecar, sglang_double, path, model):
    client = await make_sidecar()
    resp = await client.post(path, json=DOORS[path](model))
    body = await resp.json()
    assert resp.status == 404, body
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    else:
        assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    message = _message(path, body)
    assert len(message) < 200 and "\x00" not in message  # the client's name, escaped and cut short
    assert sglang_double.requests == []
    served = await client.post(path, json=DOORS[path](sglang_double.served_model_name))
    assert served.status == 200, await served.text()


@pytest.mark.parametrize("path", list(DOORS))
async def test_accept_any_model_accepts_any_name_on_every_door(make_sidecar, path):
    client = await make_sidecar(accept_any_model=True)
    resp = await client.post(path, json=DOORS[path]("claude-sonnet-4-5"))
    assert resp.status == 200, await resp.text()


async def test_no_model_named_yet_is_a_503_not_a_placeholder(aiohttp_client, qwen3_tokenizer_dir, qwen3_tokenizer, unused_tcp_port):
    from sidecar.server.app import create_app
    from sidecar.settings import load_settings

    # nothing answers at the engine's URL: /server_info never names a model
    settings = load_settings(overrides={"server": {
        "sglang_url": f"http://127.0.0.1:{unused_tcp_port}", "tokenizer": str(qwen3_tokenizer_dir), "startup_wait": 0.0,
    }})
    client = await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))
    models = await client.get("/v1/models")
    assert models.status == 503 and models.headers["Retry-After"] == "2"
    assert (await models.json())["error"]["code"] == "engine_info_unknown"
    for path, body in DOORS.items():
        resp = await client.post(path, json=body("default"))
        assert resp.status == 503, (path, await resp.text())


async def test_the_root_answers_head_and_get_without_a_key(make_sidecar):
    client = await make_sidecar(api_key="secret")
    head = await client.head("/")
    assert head.status == 200  # Claude Code's connectivity probe
    got = await client.get("/")
    assert got.status == 200 and "/v1/messages" in await got.text()
    assert (await client.get("/v1/models")).status == 401

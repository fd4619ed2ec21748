"""Every error answers in the envelope of the API its route speaks: Anthropic's on /v1/messages and
below it (however the error arose: auth, an unknown method or path, the door), OpenAI's elsewhere."""

from __future__ import annotations

import pytest

from sidecar.server.app import create_app
from sidecar.settings import load_settings

KEY = "sk-envelope-0123456789abcdef"


@pytest.fixture
async def client(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer, tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(KEY + "\n")
    settings = load_settings(overrides={"server": {
        "sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir), "api_keys_file": str(keys_file),
    }})
    return await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))


def anthropic_shaped(body) -> bool:
    return body.get("type") == "error" and set(body["error"]) == {"type", "message"}


def openai_shaped(body) -> bool:
    return "type" not in body and set(body["error"]) == {"message", "type", "param", "code"}


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("method, path, headers, status", [
    ("POST", "/v1/messages", {}, 401),  # refused by auth, before any route runs
    ("POST", "/v1/messages/count_tokens", {}, 401),
    ("GET", "/v1/messages", AUTH, 405),
    ("POST", "/v1/messages/nope", AUTH, 404),
    ("POST", "/v1/messages", AUTH, 400),  # the door's own refusal (no messages)
])
async def test_anthropic_routes_answer_errors_in_anthropics_envelope(client, method, path, headers, status):
    resp = await client.request(method, path, headers=headers, json={} if method == "POST" else None)
    assert resp.status == status and anthropic_shaped(await resp.json())


@pytest.mark.parametrize("method, path, headers, status", [
    ("POST", "/v1/chat/completions", {}, 401),
    ("POST", "/v1/messagesx", AUTH, 404),  # a prefix of the name is not the route
    ("GET", "/v1/chat/completions", AUTH, 405),
    ("POST", "/v1/responses", AUTH, 400),
])
async def test_other_routes_answer_errors_in_openais_envelope(client, method, path, headers, status):
    resp = await client.request(method, path, headers=headers, json={} if method == "POST" else None)
    assert resp.status == status and openai_shaped(await resp.json())

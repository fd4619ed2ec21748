"""Optional auth: bearer keys, what each route needs, per-key session scopes, SGLang's own key."""

from __future__ import annotations

import asyncio
import os

import pytest

from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder
from sidecar_tools.simulator.standin import SGLangStandIn

from sidecar.server import auth
from sidecar.server.app import StartupError, create_app
from sidecar.settings import load_settings

KEY_A = "sk-alpha-0123456789abcdef"
KEY_B = "sk-bravo-fedcba9876543210"
ENGINE_KEY = "engine-secret-42"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


A, B = bearer(KEY_A), bearer(KEY_B)
HELLO = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
async def make_sidecar(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer, tmp_path):
    """``await make_sidecar(**server_settings)`` -> test client; keys A and B in a keys file by default."""
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# agents\n{KEY_A}\n\n{KEY_B}\n")

    async def make(double=None, admission=None, **server):
        server.setdefault("api_keys_file", str(keys_file))
        double = double or sglang_double
        settings = load_settings(
            overrides={"server": {"sglang_url": double.url, "tokenizer": str(qwen3_tokenizer_dir), **server},
                       "admission": admission or {}}
        )
        return await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))

    make.keys_file = keys_file
    return make


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


async def _chat(client, body, headers):
    resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    return resp.status, await resp.json()


async def _sessions(client, headers=None):
    resp = await client.get("/v1/sessions", headers=headers)
    assert resp.status == 200
    return {s["id"]: s for s in (await resp.json())["data"]}


# --------------------------------------------------------------------------- keys and routes


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "missing API key"),
        (bearer("sk-wrong"), "invalid API key"),
        ({"Authorization": f"Basic {KEY_A}"}, "invalid API key"),
        ({"Authorization": "Bearer"}, "invalid API key"),
        (bearer(KEY_A + "x"), "invalid API key"),
        (bearer(KEY_A[:-1]), "invalid API key"),
    ],
)
async def test_requests_without_a_valid_key_get_401_and_never_reach_sglang(make_sidecar, sglang_double, headers, message):
    client = await make_sidecar()
    resp = await client.post("/v1/chat/completions", json=HELLO, headers=headers)
    body = await resp.json()
    assert resp.status == 401, body
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert body["error"]["code"] == "invalid_api_key" and message in body["error"]["message"]
    assert KEY_A not in str(body)
    assert (await client.get("/v1/models", headers=headers)).status == 401
    assert sglang_double.requests == []


async def test_a_valid_key_passes_and_health_stays_open(make_sidecar, sglang_double):
    client = await make_sidecar()
    for headers in (A, B, {"Authorization": f"bearer  {KEY_A} "}):
        status, body = await _chat(client, HELLO, headers)
        assert status == 200, body
    assert (await client.get("/v1/models", headers=A)).status == 200
    assert (await client.get("/health")).status == 200  # probes carry no secrets


async def test_single_api_key_setting(make_sidecar):
    client = await make_sidecar(api_keys_file=None, api_key="only-key-123")
    assert (await _chat(client, HELLO, bearer("only-key-123")))[0] == 200
    assert (await _chat(client, HELLO, A))[0] == 401


async def test_api_key_and_keys_file_together(make_sidecar):
    client = await make_sidecar(api_key="ops-key-123")
    for headers in (bearer("ops-key-123"), A, B):
        assert (await _chat(client, HELLO, headers))[0] == 200


async def test_metrics_open_by_default_protected_on_request(make_sidecar):
    client = await make_sidecar()
    assert (await client.get("/metrics")).status == 200
    assert (await client.get("/metrics", headers=bearer("nope"))).status == 401  # a wrong key is never ignored
    guarded = await make_sidecar(protect_metrics=True)
    assert (await guarded.get("/metrics")).status == 401
    resp = await guarded.get("/metrics", headers=A)
    assert resp.status == 200 and "sidecar_requests_total" in await resp.text()


async def test_sessions_route_protected_by_default(make_sidecar):
    client = await make_sidecar()
    assert (await client.get("/v1/sessions")).status == 401
    assert (await client.delete("/v1/sessions/x")).status == 401
    assert (await client.post("/close_session", json={"session_id": "x"})).status == 401


async def test_unprotected_sessions_list_is_read_only(make_sidecar):
    client = await make_sidecar(protect_sessions=False)
    await _chat(client, {**HELLO, "session_id": "a-1"}, A)
    await _chat(client, {**HELLO, "session_id": "b-1"}, B)
    everything = await _sessions(client)  # the operator's view, no key
    assert set(everything) == {"a-1", "b-1"}
    assert everything["a-1"]["scope"] == auth.scope_of_key(KEY_A) != everything["b-1"]["scope"]
    assert set(await _sessions(client, A)) == {"a-1"}  # a key still sees only its own
    assert (await client.delete("/v1/sessions/a-1")).status == 401  # closing always needs the key
    assert (await client.delete("/v1/sessions/a-1", headers=A)).status == 200


# --------------------------------------------------------------------------- scopes


async def test_same_explicit_id_under_two_keys_is_two_sessions(make_sidecar, sglang_double, qwen3_tokenizer):
    client = await make_sidecar()
    reply = "<think>\nA's private plan\n</think>\n\nok"
    sglang_double.responder = scripted_responder(_encode(qwen3_tokenizer, reply) + [IM_END_ID])
    sid = {"X-Session-Id": "agent-1"}
    messages = [{"role": "user", "content": "task"}]
    _, first_a = await _chat(client, {"messages": messages}, {**A, **sid})
    _, first_b = await _chat(client, {"messages": [{"role": "user", "content": "other task"}]}, {**B, **sid})
    sent_a, sent_b = (r["session_id"] for r in sglang_double.requests)
    assert sent_a != sent_b and sent_a.endswith(":agent-1") and sent_b.endswith(":agent-1")
    assert KEY_A not in sent_a and KEY_B not in sent_b  # SGLang sees a hash, never the key

    # B replays A's history under A's id: it must not continue A's ids.
    follow = messages + [first_a["choices"][0]["message"], {"role": "user", "content": "next"}]
    await _chat(client, {"messages": follow}, {**B, **sid})
    assert sglang_double.requests[-1]["session_id"] == sent_b
    a_history = sglang_double.requests[0]["input_ids"] + sglang_double.results[0]["output_ids"]
    assert sglang_double.requests[-1]["input_ids"][: len(a_history)] != a_history  # B's own branch
    assert "private plan" not in qwen3_tokenizer.decode(sglang_double.requests[-1]["input_ids"])
    # A continues its own session token-exactly.
    await _chat(client, {"messages": follow}, {**A, **sid})
    assert sglang_double.requests[-1]["session_id"] == sent_a
    assert sglang_double.requests[-1]["input_ids"][: len(a_history)] == a_history

    listed_a, listed_b = await _sessions(client, A), await _sessions(client, B)
    assert set(listed_a) == set(listed_b) == {"agent-1"}
    assert listed_a["agent-1"]["turns"] == 2 and listed_b["agent-1"]["turns"] == 2


async def test_implicit_recognition_never_crosses_keys(make_sidecar, sglang_double, qwen3_tokenizer):
    """The same conversation from another key is rendered whole, never continued from A's ids."""
    client = await make_sidecar()
    reply = "<think>\nprivate reasoning\n</think>\n\nDone."
    sglang_double.responder = scripted_responder(_encode(qwen3_tokenizer, reply) + [IM_END_ID])
    messages = [{"role": "user", "content": "shared question"}]
    _, first = await _chat(client, {"messages": messages}, A)
    follow = messages + [first["choices"][0]["message"], {"role": "user", "content": "and?"}]

    await _chat(client, {"messages": follow}, B)
    rendered = qwen3_tokenizer.apply_chat_template(follow, tokenize=False, add_generation_prompt=True)
    b_request = sglang_double.requests[-1]
    assert b_request["input_ids"] == _encode(qwen3_tokenizer, rendered)
    assert "private reasoning" not in qwen3_tokenizer.decode(b_request["input_ids"])
    assert b_request["session_id"] != sglang_double.requests[0]["session_id"]

    await _chat(client, {"messages": follow}, A)  # A itself still continues exactly
    a_history = sglang_double.requests[0]["input_ids"] + sglang_double.results[0]["output_ids"]
    assert sglang_double.requests[-1]["session_id"] == sglang_double.requests[0]["session_id"]
    assert sglang_double.requests[-1]["input_ids"][: len(a_history)] == a_history


async def test_a_key_cannot_see_or_close_another_keys_session(make_sidecar, sglang_double):
    client = await make_sidecar()
    await _chat(client, {**HELLO, "session_id": "secret-plan"}, A)
    assert "secret-plan" not in await _sessions(client, B)
    resp = await client.delete("/v1/sessions/secret-plan", headers=B)
    assert resp.status == 404  # same answer as for an id that does not exist
    resp = await client.post("/close_session", json={"session_id": "secret-plan"}, headers=B)
    assert resp.status == 404
    assert "secret-plan" in await _sessions(client, A)
    assert (await client.delete("/v1/sessions/secret-plan", headers=A)).status == 200
    await asyncio.sleep(0.05)
    closed = sglang_double.closed_sessions[-1]["session_id"]
    assert closed == sglang_double.requests[0]["session_id"] and closed.endswith(":secret-plan")


def test_scope_is_a_stable_hash_of_the_key():
    assert auth.scope_of_key(KEY_A) == auth.scope_of_key(KEY_A)
    assert auth.scope_of_key(KEY_A) != auth.scope_of_key(KEY_B)
    assert len(auth.scope_of_key(KEY_A)) == 16 and KEY_A not in auth.scope_of_key(KEY_A)


# --------------------------------------------------------------------------- keys file


async def test_keys_file_is_reloaded_when_it_changes(make_sidecar, monkeypatch):
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", 0.0)
    client = await make_sidecar()
    path = make_sidecar.keys_file
    assert (await _chat(client, HELLO, A))[0] == 200
    path.write_text(f"{KEY_B}\nsk-charlie-new-key\n")
    os.utime(path, (1, 1))  # a distinct mtime even on coarse file systems
    assert (await _chat(client, HELLO, bearer("sk-charlie-new-key")))[0] == 200
    assert (await _chat(client, HELLO, A))[0] == 401  # revoked
    path.write_text("")  # mid-edit / emptied: keep what was loaded
    os.utime(path, (2, 2))
    assert (await _chat(client, HELLO, B))[0] == 200
    path.unlink()
    assert (await _chat(client, HELLO, B))[0] == 200


@pytest.mark.parametrize(
    "content, fragment",
    [("", "no keys"), ("# only a comment\n\n", "no keys"), ("two words\n", "whitespace")],
)
def test_unusable_keys_file_refuses_to_start(tmp_path, content, fragment):
    path = tmp_path / "keys"
    path.write_text(content)
    with pytest.raises(StartupError, match=fragment):
        create_app(load_settings(overrides={"server": {"api_keys_file": str(path)}}))
    with pytest.raises(StartupError, match="cannot read"):
        create_app(load_settings(overrides={"server": {"api_keys_file": str(tmp_path / "missing")}}))


# --------------------------------------------------------------------------- SGLang's own key


@pytest.fixture
async def guarded_double():
    """The stand-in launched with SGLang's --api-key: every route but /health and /metrics needs it."""
    double = SGLangStandIn(api_key=ENGINE_KEY)
    await double.start()
    yield double
    await double.stop()


def seen_auth(double) -> list[tuple[str, str | None]]:
    """(path, Authorization header) of every call the engine received."""
    return [(path, header) for _, path, header in double.calls]


async def test_sglang_api_key_is_sent_on_every_engine_call(make_sidecar, guarded_double, qwen3_tokenizer, sse):
    client = await make_sidecar(double=guarded_double, sglang_api_key=ENGINE_KEY)
    models = await (await client.get("/v1/models", headers=A)).json()
    assert models["data"][0]["id"] == guarded_double.served_model_name  # /server_info answered at startup

    guarded_double.responder = scripted_responder(_encode(qwen3_tokenizer, "alpha STOP beta gamma delta"))
    status, body = await _chat(client, {**HELLO, "max_tokens": 20, "stop": ["STOP"], "session_id": "s1"}, A)
    assert status == 200 and body["choices"][0]["message"]["content"] == "alpha "
    resp = await client.post("/v1/chat/completions", json={**HELLO, "stream": True}, headers=A)
    assert resp.status == 200 and sse(await resp.read())[-1] == "[DONE]"
    assert (await client.get("/health")).status == 200
    assert (await client.delete("/v1/sessions/s1", headers=A)).status == 200
    await asyncio.sleep(0.05)

    assert guarded_double.aborts and guarded_double.closed_sessions  # both got through the guard
    paths = {path for path, _ in seen_auth(guarded_double)}
    assert {"/server_info", "/generate", "/abort_request", "/close_session", "/health"} <= paths
    # Every call carried SGLang's key; the agent's own key never travels to the engine.
    assert {header for _, header in seen_auth(guarded_double)} == {f"Bearer {ENGINE_KEY}"}


async def test_missing_sglang_key_is_a_clear_502(make_sidecar, guarded_double):
    client = await make_sidecar(double=guarded_double, api_keys_file=None)
    status, body = await _chat(client, HELLO, {})
    assert status == 502 and "--sglang-api-key" in body["error"]["message"]
    assert seen_auth(guarded_double) and all(header is None for _, header in seen_auth(guarded_double))


# --------------------------------------------------------------------------- the prefix cache across keys

SECRET = "You are the vault agent. The vault code is 4 8 1 5 9 2."


def _guess(prefix: str) -> dict:
    return {"messages": [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": prefix}],
            "max_tokens": 1}


async def _read_next_digit(client, known: str) -> dict[str, int]:
    """The oracle attack: key B warms its own path up to the unknown digit, then tries each digit
    and reads usage.cached_tokens; a digit another key's prompt continues with matches one more
    token of the cache. (The warm-up digit, 0, is left out: B's own prompt is all cached.)"""
    await _chat(client, _guess(known + "0"), B)
    cached = {}
    for digit in "123456789":
        status, body = await _chat(client, _guess(known + digit), B)
        assert status == 200, body
        cached[digit] = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


async def test_no_key_can_read_another_keys_prompt_from_cached_tokens(make_sidecar, sglang_double):
    client = await make_sidecar()
    status, _ = await _chat(client, _guess(SECRET), A)
    assert status == 200
    cached = await _read_next_digit(client, "You are the vault agent. The vault code is 4 8 1 ")
    assert len(set(cached.values())) == 1, cached  # every guess looks alike: "5" stands out in none
    salts = {r.get("cache_salt") for r in sglang_double.requests}
    assert salts == {auth.scope_of_key(KEY_A), auth.scope_of_key(KEY_B)}


async def test_without_isolation_the_oracle_is_open(make_sidecar):
    """What isolation closes (and what --no-cache-isolation re-opens)."""
    client = await make_sidecar(cache_isolation=False)
    await _chat(client, _guess(SECRET), A)
    cached = await _read_next_digit(client, "You are the vault agent. The vault code is 4 8 1 ")
    assert max(cached, key=cached.get) == "5" and sorted(cached.values())[-2] < cached["5"]


async def test_a_declared_shared_prefix_is_shared_and_shows_nothing_more(make_sidecar, sglang_double, tmp_path):
    framework = "You are a coding agent of the Example framework. Use the tools."
    prefix_file = tmp_path / "system.txt"
    prefix_file.write_text(framework + "\n")
    client = await make_sidecar(shared_prefix_file=str(prefix_file))
    system = {"role": "system", "content": framework}
    status, _ = await _chat(client, {"messages": [system, {"role": "user", "content": SECRET}], "max_tokens": 1}, A)
    assert status == 200
    # B's new session starts with the same system prompt: its KV is A's (one shared namespace),
    # and B sees exactly the system block as cached
    status, body = await _chat(client, {"messages": [system, {"role": "user", "content": "hello"}], "max_tokens": 1}, B)
    block = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert status == 200 and block > 10
    assert {r["cache_salt"] for r in sglang_double.requests} == {"shared"}
    # guessing A's private text: the engine matches more, B is shown no more than the block
    engine_cached = []
    sglang_double_results = sglang_double.results
    for guess in (SECRET[:30], SECRET[:40]):
        status, body = await _chat(client, {"messages": [system, {"role": "user", "content": guess}], "max_tokens": 1}, B)
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == block
        engine_cached.append(sglang_double_results[-1]["meta_info"]["cached_tokens"])
    assert engine_cached[0] > block
    # a request with another system prompt stays in its key's own namespace
    await _chat(client, _guess("hi"), B)
    assert sglang_double.requests[-1]["cache_salt"] == auth.scope_of_key(KEY_B)


# --------------------------------------------------------------------------- fairness across keys


async def test_one_key_cannot_fill_the_admission_queue(make_sglang_double, make_sidecar):
    """Key B opens many sessions while the engine is full: past its share of the queue B gets 429
    at once, and key A's new session still queues (and is admitted when room comes)."""
    double = await make_sglang_double(max_total_num_tokens=400, context_length=300)
    client = await make_sidecar(double=double, key_queue_share=0.5, admission={"enabled": True, "max_queue": 8})
    double.token_delay = 0.05
    # a resident session that fills the pool's budget: every new one must wait
    first = asyncio.ensure_future(_chat(client, {"messages": [{"role": "user", "content": "x " * 120}], "max_tokens": 60}, A))
    await double.wait_for_running()
    b_waiting = [asyncio.ensure_future(_chat(client, {"messages": [{"role": "user", "content": f"b{i} " * 40}], "max_tokens": 2}, B))
                 for i in range(4)]
    await asyncio.sleep(0.2)
    status, err = await _chat(client, {"messages": [{"role": "user", "content": "b-more " * 40}], "max_tokens": 2}, B)
    assert status == 429 and err["error"]["code"] == "key_queue_share_exceeded", err
    a_new = asyncio.ensure_future(_chat(client, {"messages": [{"role": "user", "content": "a-new " * 40}], "max_tokens": 2}, A))
    await asyncio.sleep(0.2)
    assert not a_new.done()  # queued, not refused
    results = await asyncio.gather(first, a_new, *b_waiting)
    assert [status for status, _ in results] == [200] * 6


async def test_per_key_rate_limit(make_sidecar, sglang_double):
    client = await make_sidecar(key_rate_limit=1.0, key_rate_burst=2)
    assert [(await _chat(client, HELLO, A))[0] for _ in range(2)] == [200, 200]
    resp = await client.post("/v1/chat/completions", json=HELLO, headers=A)
    assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
    assert (await _chat(client, HELLO, B))[0] == 200  # another key is not slowed down

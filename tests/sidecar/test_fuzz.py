"""Hostile input: /v1/chat/completions fuzzed with hypothesis (requests and engine output).

One sidecar + SGLang double run for the whole module on a background event loop (hypothesis
examples are synchronous). Properties, for every input:
  * never a 5xx, always an OpenAI error envelope or a well-formed reply / SSE stream;
  * the sidecar keeps serving, and every request it forwards satisfies SGLang's schema;
  * no state corruption: nothing left in flight, and a canary session still continues
    token-exactly after everything the fuzzer threw at it.
The limits (body size, message count, prompt tokens, session ids) are checked at their edges.

The suite runs a fixed, modest sample (derandomized, ~700 requests). A deeper, random run:
``FUZZ_SCALE=12 python -m pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hostile_values import json_values, numbers, plain, texts

from sidecar_tools.simulator.generate_request import VOCAB_SIZE as QWEN3_VOCAB_SIZE
from sidecar_tools.simulator.generate_request import check_schema
from sidecar_tools.simulator.http_contract import parse_sse
from sidecar_tools.simulator.replies import IM_END_ID
from sidecar_tools.simulator.standin import SGLangStandIn

from sidecar.server import keys
from sidecar.server.app import create_app
from sidecar.conversation.store import SESSION_ID_RE
from sidecar.generation.tool_parsers import get_tool_parser
from sidecar.openai.chat_completions import turn_request
from sidecar.openai.schema import parse_chat_request
from sidecar.settings import load_settings

MAX_BODY = 64 * 1024
MAX_MESSAGES = 12
MAX_PROMPT = 3000
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    derandomize=SCALE == 1,  # the suite stays reproducible; FUZZ_SCALE > 1 explores at random
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


class Stack:
    """The double and a sidecar served from a thread with its own loop; ``call`` runs a coroutine there."""

    def __init__(self, tokenizer_dir, tokenizer):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tokenizer = tokenizer
        self.call(self._start(tokenizer_dir, tokenizer))

    def call(self, coro, timeout: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, tokenizer_dir, tokenizer):
        # Room for every session the fuzzer opens: admission (on, below) must never make one wait,
        # so /server_info reports a pool far larger than the engine's (which evicts as it must).
        self.double = SGLangStandIn(server_info_overrides={"max_total_num_tokens": 100_000_000})
        self.reply_ids = tokenizer.encode("fine", add_special_tokens=False) + [IM_END_ID]
        self.double.responder = lambda ids, params: list(self.reply_ids)
        await self.double.start()
        settings_ = load_settings(
            overrides={
                "server": {
                    "sglang_url": self.double.url,
                    "tokenizer": str(tokenizer_dir),
                    "max_body_bytes": MAX_BODY,
                    "max_messages": MAX_MESSAGES,
                    "max_prompt_tokens": MAX_PROMPT,
                    "default_max_tokens": 16,
                    "request_timeout": 10,
                },
                "policy": {"mode": "fixed"},
                "admission": {"enabled": True, "max_wait": 2.0},
            }
        )
        self.app = create_app(settings_, tokenizer=tokenizer)
        self.runner = web.AppRunner(self.app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.http = aiohttp.ClientSession()

    async def _post(self, data: bytes, headers: dict[str, str]):
        async with self.http.post(self.url + "/v1/chat/completions", data=data, headers=headers) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()

    def post(self, data: bytes, headers: dict[str, str] | None = None):
        return self.call(self._post(data, {"Content-Type": "application/json", **(headers or {})}))

    def post_json(self, body: Any, headers: dict[str, str] | None = None):
        return self.post(json.dumps(body).encode(), headers)

    async def _stop(self):
        await self.http.close()
        await self.runner.cleanup()
        await self.double.stop()

    def close(self):
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def stack(qwen3_tokenizer_dir, qwen3_tokenizer):
    s = Stack(qwen3_tokenizer_dir, qwen3_tokenizer)
    yield s
    s.close()


def check_answer(status: int, content_type: str, raw: bytes, stream: bool = False) -> None:
    """The properties every answer must have, whatever the input was."""
    event(f"HTTP {status}")
    assert status < 500, raw[:500]
    if status == 200 and content_type.startswith("text/event-stream"):
        events = parse_sse(raw)
        assert events and events[-1] == "[DONE]", raw[-300:]
        for chunk in events[:-1]:
            assert "error" not in chunk, chunk  # the double never fails here: an error is the sidecar's
            assert chunk["object"] == "chat.completion.chunk"
        return
    body = json.loads(raw)
    if status == 200:
        assert not stream
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
        return
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and err["type"] != "server_error"


def check_state(stack: Stack) -> None:
    store, policy = stack.app[keys.SESSIONS], stack.app[keys.TURNS].policy
    assert all(s.inflight == 0 for s in store.all())
    assert all(record.running == 0 for record in store.records())
    assert policy.gate.queue_length == 0
    for body in stack.double.requests:  # everything forwarded speaks SGLang's schema
        check_schema(body)
        assert len(body["input_ids"]) <= MAX_PROMPT


# --------------------------------------------------------------------------- strategies

content = st.one_of(
    texts,
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio"]), "text": texts}), max_size=3),
    json_values,
)
tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": texts, "arguments": st.one_of(texts, json_values.map(json.dumps))})},
    optional={"id": texts, "type": st.sampled_from(["function", "other"])},
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", "USER"]), "content": content},
    optional={
        "name": texts,
        "tool_calls": st.lists(tool_call, max_size=2),
        "tool_call_id": texts,
        "reasoning_content": texts,
    },
)
tool_def = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "function", "retrieval"]),
        "function": st.fixed_dictionaries(
            {"name": texts}, optional={"description": texts, "parameters": json_values, "strict": json_values}
        ),
    }
)
FIELDS = {
    "model": texts,
    "tools": st.lists(tool_def, max_size=2),
    "tool_choice": st.one_of(
        st.sampled_from(["auto", "none", "required", "any"]),
        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": texts})}),
        json_values,
    ),
    "max_tokens": numbers,
    "max_completion_tokens": numbers,
    "temperature": numbers,
    "top_p": numbers,
    "top_k": numbers,
    "min_p": numbers,
    "seed": numbers,
    "n": numbers,
    "stop": st.one_of(texts, st.lists(texts, max_size=3), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "repetition_penalty": numbers,
    "min_tokens": numbers,
    "ignore_eos": st.one_of(st.booleans(), json_values),
    "stop_token_ids": st.one_of(st.lists(st.integers(-5, 2**64), max_size=3), json_values),
    "logprobs": json_values,
    "user": texts,
    "session_id": st.one_of(texts, json_values),
    "chat_template_kwargs": st.one_of(
        st.dictionaries(
            st.sampled_from(["enable_thinking", "tokenize", "chat_template", "add_generation_prompt", "tools", "x", "messages"]),
            json_values,
            max_size=2,
        ),
        json_values,
    ),
    "parallel_tool_calls": json_values,
    "unknown_field": json_values,
}
bodies = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(message, min_size=1, max_size=4), json_values)},
    optional=FIELDS,
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=140)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()  # NaN/Infinity literals too: Python's json reads them


# Well-formed requests with hostile values, so the fuzzer gets past validation into rendering,
# session matching, the engine call and the relay.
names = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)
arguments = st.one_of(json_values.map(lambda v: json.dumps(v, allow_nan=True)), plain)


@st.composite
def valid_bodies(draw, messages=None):
    tools = draw(st.lists(st.builds(lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}},
                                    names, st.dictionaries(plain, json_values, max_size=2)), max_size=2, unique_by=lambda t: t["function"]["name"]))
    if messages is None:
        messages = draw(st.lists(valid_message(), min_size=1, max_size=4))
    body = {"messages": messages, "max_tokens": draw(st.integers(1, 24)), "stream": draw(st.booleans())}
    if tools:
        body["tools"] = tools
    choices = ["auto", "none"] + (["required", {"type": "function", "function": {"name": tools[0]["function"]["name"]}}] if tools else [])
    optional = {
        "tool_choice": st.sampled_from(choices),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "stop": st.lists(plain, min_size=1, max_size=3),
        "seed": st.integers(0, 2**31),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()}),
        "session_id": st.from_regex(r"[A-Za-z0-9._:@\-]{1,20}", fullmatch=True),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            body[key] = draw(strategy)
    return body


def valid_message():
    text_content = st.one_of(plain, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": plain}), min_size=1, max_size=2))
    call = st.builds(lambda n, a, i: {"id": i, "type": "function", "function": {"name": n, "arguments": a}}, names, arguments, plain)
    return st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user"]), "content": text_content}),
        st.fixed_dictionaries({"role": st.just("tool"), "content": text_content}, optional={"tool_call_id": plain}),
        st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(st.none(), plain)},
                              optional={"tool_calls": st.lists(call, min_size=1, max_size=2), "reasoning_content": plain}),
    )


# --------------------------------------------------------------------------- the canary


@pytest.fixture(scope="module")
def canary(stack):
    """A session with one finished turn, checked after all fuzzing (must still continue exactly)."""
    messages = [{"role": "user", "content": "canary task"}]
    status, _, raw = stack.post_json({"messages": messages}, {"X-Session-Id": "canary"})
    assert status == 200
    reply = json.loads(raw)["choices"][0]["message"]
    request, result = stack.double.requests[-1], stack.double.results[-1]
    return {"messages": messages + [reply], "ids": request["input_ids"] + result["output_ids"]}


# --------------------------------------------------------------------------- fuzz


@FUZZ
@given(body=bodies)
def test_fuzzed_chat_bodies(stack, canary, body):
    status, ctype, raw = stack.post(_dumps(body))
    check_answer(status, ctype, raw, stream=body.get("stream") is True)


@FUZZ
@given(body=bodies, session_id=header_text)
def test_fuzzed_bodies_with_session_header_in_stream_mode(stack, canary, body, session_id):
    body = {**body, "stream": True} if isinstance(body, dict) else body
    status, ctype, raw = stack.post(_dumps(body), {"X-Session-Id": session_id})
    check_answer(status, ctype, raw, stream=True)
    sid = session_id.strip(" \t")  # HTTP drops surrounding blanks of a header value
    if sid and not SESSION_ID_RE.match(sid):
        assert status == 400


@FUZZ
@given(body=valid_bodies())
def test_fuzzed_well_formed_bodies(stack, canary, body):
    status, ctype, raw = stack.post_json(body)
    check_answer(status, ctype, raw, stream=body["stream"])
    if status != 200:  # only the template (e.g. a system turn in the middle) or bad Unicode may refuse it
        message = json.loads(raw)["error"]["message"]
        assert "chat template" in message or "not valid Unicode" in message, raw


@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
def test_fuzzed_conversations_never_mix_continuation_and_rerender(stack, canary, data):
    """Turn 2 echoes turn 1's reply, maybe altered. Whatever the agent sends, the ids the engine gets
    are either exactly turn 1's ids + a rendered suffix, or the whole history rendered anew."""
    first = data.draw(valid_bodies())
    first.update(stream=False, session_id=None)
    first.pop("session_id")
    status, _, raw = stack.post_json(first)
    if status != 200:
        return
    reply = json.loads(raw)["choices"][0]["message"]
    held = stack.double.requests[-1]["input_ids"] + stack.double.results[-1]["output_ids"]
    alteration = data.draw(st.sampled_from(["none", "strip", "content", "drop_calls", "reorder_args"]))
    if alteration == "strip" and reply.get("content"):
        reply["content"] = "  " + reply["content"] + "\n"
    elif alteration == "content":
        reply["content"] = data.draw(plain)
    elif alteration == "drop_calls":
        reply.pop("tool_calls", None)
    elif alteration == "reorder_args":
        for call in reply.get("tool_calls") or []:
            call["id"] = "call_other"
            call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=1)
    messages = first["messages"] + [reply] + data.draw(st.lists(valid_message(), min_size=1, max_size=2))
    second = {**first, "messages": messages}
    status, ctype, raw = stack.post_json(second)
    check_answer(status, ctype, raw)
    if status != 200:
        return
    sent = stack.double.requests[-1]["input_ids"]
    continued = sent[: len(held)] == held
    req = parse_chat_request(json.loads(json.dumps(second)), stack.app[keys.SETTINGS].server)
    turn = turn_request(req, None, "")
    full = stack.app[keys.TURNS].renderer.render_full(turn.messages, turn.tools, turn.template_kwargs)
    if turn.tool_choice == "required":
        full += stack.app[keys.TURNS].renderer.encode(get_tool_parser("hermes").forced_prefix(turn.forced_tool))
    assert continued or sent == full
    event(f"continued={continued} alteration={alteration}")


@settings(FUZZ, max_examples=examples(60))
@given(
    raw=st.one_of(
        st.binary(max_size=300),
        st.text(max_size=200).map(str.encode),
        st.integers(1, 3000).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}"),
        st.integers(1, 3000).map(lambda n: b'{"a": ' * n + b"1" + b"}" * n),
        st.just(b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
        st.just(b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'),
    ),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
def test_fuzzed_raw_bodies(stack, raw, content_type):
    status, ctype, answer = stack.post(raw, {"Content-Type": content_type})
    check_answer(status, ctype, answer)


# Engine output: any ids SGLang could send back, incl. specials, tool-call markup and unknown ids.
SPECIAL_IDS = list(range(151643, 151669))
engine_ids = st.lists(
    st.one_of(
        st.integers(0, 151642),
        st.sampled_from(SPECIAL_IDS),
        st.integers(151669, QWEN3_VOCAB_SIZE - 1),
        st.sampled_from([151657, 151658, 151667, 151668, 515, 1, 92]),  # <tool_call> </tool_call> <think> </think> { " }
    ),
    max_size=40,
)


@settings(FUZZ, max_examples=examples(80))
@given(ids=engine_ids, stream=st.booleans(), tools=st.booleans(), stop=st.one_of(st.none(), st.lists(plain, min_size=1, max_size=2)))
def test_fuzzed_engine_output(stack, canary, ids, stream, tools, stop):
    stack.reply_ids = ids
    body = {"messages": [{"role": "user", "content": "go"}], "stream": stream, "max_tokens": 50}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    if stop is not None:
        body["stop"] = stop
    try:
        status, ctype, raw = stack.post_json(body)
    finally:
        stack.reply_ids = stack.tokenizer.encode("fine", add_special_tokens=False) + [IM_END_ID]
    assert status == 200, raw[:300]
    check_answer(status, ctype, raw, stream=stream)
    if not stream:
        message = json.loads(raw)["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            json.loads(call["function"]["arguments"])  # arguments relayed are always valid JSON


def test_zz_state_is_consistent_after_fuzzing(stack, canary):
    """Runs after the fuzz tests in this module (file order): nothing stuck, canary still exact."""
    check_state(stack)
    messages = canary["messages"] + [{"role": "user", "content": "still there?"}]
    status, _, raw = stack.post_json({"messages": messages}, {"X-Session-Id": "canary"})
    assert status == 200, raw
    sent = stack.double.requests[-1]
    assert sent["session_id"] == "canary"
    assert sent["input_ids"][: len(canary["ids"])] == canary["ids"]
    assert (stack.call(_health(stack))) == 200


async def _health(stack):
    async with stack.http.get(stack.url + "/health") as resp:
        return resp.status


# --------------------------------------------------------------------------- limits at their edges


def test_message_count_limit(stack):
    many = [{"role": "user", "content": "x"}] * MAX_MESSAGES
    assert stack.post_json({"messages": many, "max_tokens": 2})[0] == 200
    status, _, raw = stack.post_json({"messages": many + [{"role": "user", "content": "x"}]})
    assert status == 400 and json.loads(raw)["error"]["param"] == "messages"


def test_body_size_limit_at_the_edge(stack):
    base = _dumps({"messages": [{"role": "user", "content": ""}], "max_tokens": 1, "pad": ""})
    fits = _dumps({"messages": [{"role": "user", "content": ""}], "max_tokens": 1, "pad": "x" * (MAX_BODY - len(base))})
    assert len(fits) == MAX_BODY and stack.post(fits)[0] == 200
    status, _, raw = stack.post(fits[:-1] + b' }')
    assert status == 413 and json.loads(raw)["error"]["code"] == "body_too_large"


def test_prompt_token_limit_at_the_edge(stack):
    renderer = stack.app[keys.TURNS].renderer

    def body(n_words):
        return {"messages": [{"role": "user", "content": "hi" + " hi" * n_words}], "max_tokens": 1}

    overhead = len(renderer.render_full(body(0)["messages"]))
    at_limit = body(MAX_PROMPT - overhead)
    assert len(renderer.render_full(at_limit["messages"])) == MAX_PROMPT
    assert stack.post_json(at_limit)[0] == 200
    status, _, raw = stack.post_json(body(MAX_PROMPT - overhead + 1))
    assert status == 400 and json.loads(raw)["error"]["code"] == "context_length_exceeded"


@settings(FUZZ, max_examples=examples(80))
@given(sid=st.one_of(st.text(max_size=140), st.from_regex(r"[A-Za-z0-9._:@\-]{1,130}", fullmatch=True)))
def test_session_ids_are_validated_by_length_and_charset(stack, sid):
    ok = re.fullmatch(r"[A-Za-z0-9._:@\-]{1,128}", sid) is not None
    status, _, raw = stack.post_json({"messages": [{"role": "user", "content": "x"}], "session_id": sid, "max_tokens": 1})
    if sid == "":
        return  # an empty id is no id (OpenAI clients send user="")
    assert status == (200 if ok else 400), (sid, raw[:200])
    if ok:
        assert stack.double.requests[-1]["session_id"] == sid


def test_template_injection_is_refused(stack):
    """chat_template_kwargs may not swap the template (a Jinja loop would stall every session)."""
    loop = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
    for kwargs in ({"chat_template": loop}, {"tokenize": True}, {"add_generation_prompt": False}):
        status, _, raw = stack.post_json({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": kwargs})
        assert status == 400, raw
        assert "chat_template_kwargs" in json.loads(raw)["error"]["message"]
    ok = stack.post_json({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": False}})
    assert ok[0] == 200

"""POST /v1/chat/completions: validate, place in a session, admit, generate, relay, remember.

The order matters: a turn is recorded in the session registry only after the engine finished it,
so a failed, aborted or rejected request never changes what the next turn continues from.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Callable

from aiohttp import web

from sidecar.server import keys
from sidecar.server.auth import request_scope
from sglang_ext.wire import lease_params
from sidecar.errors import APIError, invalid_request
from sidecar.id_text import IdText
from sidecar.policy import AdmissionRejected, TurnEnd
from sidecar.generation.relay import Generation
from sidecar.openai.request_checks import check_template_kwargs, explicit_session_id, parse_chat_request, read_body
from sidecar.openai.schema import (
    ChatCompletionRequest,
    ChunkFrames,
    completion,
    completion_id,
    usage_dict,
)
from sidecar.conversation.store import Resolution, TurnState, extend_fingerprint
from sidecar.generation.tool_parsers import ContentDelta, ToolCallArgumentsDelta, ToolCallStart, get_tool_parser

_DISCONNECTS = (ConnectionResetError, ConnectionError, asyncio.CancelledError)


def sampling_params(req: ChatCompletionRequest, settings, stop_ids: list[int], lease_ttl: float | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": req.wanted_max_tokens or settings.server.default_max_tokens}
    optional = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "min_new_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "sampling_seed": req.seed,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if stop_ids and not req.ignore_eos:
        params["stop_token_ids"] = stop_ids
    if lease_ttl is not None:
        params["custom_params"] = lease_params(lease_ttl)
    return params


def prompt_ids(app: web.Application, res: Resolution, messages: list[dict], req: ChatCompletionRequest) -> IdText:
    renderer = app[keys.RENDERER]
    tools = req.template_tools()
    kwargs = req.chat_template_kwargs
    if res.base is not None:
        return res.base.token_ids + renderer.render_suffix(messages[res.new_messages_from :], res.base.end_id, tools, kwargs)
    return IdText(renderer.render_full(messages, tools, kwargs))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings = app[keys.SETTINGS]
    req = parse_chat_request(await read_body(request))
    if len(req.messages) > settings.server.max_messages:
        raise invalid_request(f"too many messages ({len(req.messages)} > {settings.server.max_messages})", param="messages")
    check_template_kwargs(req.chat_template_kwargs, app[keys.RENDERER].tokenizer)
    explicit = explicit_session_id(request, req)
    messages = [m.to_template() for m in req.messages]
    registry, policy, renderer, metrics = app[keys.REGISTRY], app[keys.POLICY], app[keys.RENDERER], app[keys.METRICS]

    res = registry.resolve(messages, explicit, request_scope(request) or "")
    session = res.session
    session.inflight += 1
    admitted = False
    try:
        ids = prompt_ids(app, res, messages, req)
        forced = renderer.forced_prefix(req.tool_choice, req.tools)
        if forced is not None:
            ids += renderer.encode(forced.text)
        limit = app[keys.PROMPT_LIMIT]
        if limit and len(ids) > limit:
            raise invalid_request(
                f"prompt is {len(ids)} tokens, more than the limit of {limit}", param="messages", code="context_length_exceeded"
            )
        metrics.turns.labels(kind="continued" if res.base else ("new" if res.is_new_session else "branch")).inc()
        try:
            await policy.admit(session.id, len(ids), res.is_new_session)
        except AdmissionRejected as exc:
            raise APIError(
                429,
                str(exc),
                type="rate_limit_error",
                code="admission_queue_full",
                headers={"Retry-After": str(max(1, round(exc.retry_after_s)))},
            ) from None
        admitted = True
        now = time.monotonic()
        policy.on_request(session.id, len(ids), now)
        lease = policy.lease_ttl(session.id, len(ids), now)
        payload = {
            "rid": f"sidecar-{uuid.uuid4().hex}",
            "input_ids": ids,
            "session_id": session.id,
            "sampling_params": sampling_params(req, settings, renderer.eos_ids + list(req.stop_token_ids or []), lease),
        }
        parser_name = "none" if (req.tool_choice == "none" or not req.tools) else settings.server.tool_parser
        gen = Generation(
            app[keys.ENGINE],
            payload,
            renderer.codec,
            get_tool_parser(parser_name),
            req.stop,
            forced.text if forced else None,
        )
        stream, n_messages = req.stream, len(messages)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # The parsed history (hundreds of objects per request) is not needed while the reply
        # streams, so it is not carried through the garbage collector's generations. It is freed
        # once the reply started, so that freeing it is not on the request's way to SGLang.
        parsed: list[Any] = [req, messages]
        del req, messages
        if stream:
            response = await stream_reply(request, include_usage, gen, started=parsed.clear)
        else:
            parsed.clear()
            response = await full_reply(request, gen)
        remember_turn(app, res, n_messages, gen)
        return response
    finally:
        session.inflight -= 1
        if admitted:
            policy.release_admission(session.id)
        if not session.turns and not session.inflight and not session.explicit:
            registry.forget(session.id)  # a first request that failed leaves nothing behind


def remember_turn(app: web.Application, res: Resolution, n_messages: int, gen: Generation) -> None:
    result = gen.result
    reply = gen.reply_message()
    reply_fp = extend_fingerprint(res.fingerprint, reply)
    ids = gen.payload["input_ids"] + result.output_ids
    state = TurnState(reply_fp, n_messages + 1, ids, result.end_id)
    registry = app[keys.REGISTRY]
    registry.record_turn(res.session, state)
    now = time.monotonic()
    tool_names = [c.name for c in result.tool_calls]
    app[keys.POLICY].on_turn_end(TurnEnd(res.session.id, len(ids), tool_names, now))
    metrics = app[keys.METRICS]
    metrics.prompt_tokens.inc(result.prompt_tokens)
    metrics.cached_tokens.inc(result.cached_tokens)
    metrics.completion_tokens.inc(result.completion_tokens)


def _usage(gen: Generation) -> dict[str, Any]:
    r = gen.result
    return usage_dict(r.prompt_tokens, r.completion_tokens, r.cached_tokens)


async def full_reply(request: web.Request, gen: Generation) -> web.Response:
    try:
        async for _ in gen.events():
            pass
    except asyncio.CancelledError:
        asyncio.ensure_future(gen.engine.abort(gen.rid))
        raise
    message = gen.reply_message()
    if gen.result.tool_calls and message["content"] is not None:
        message["content"] = message["content"].strip() or None  # text around tool calls only
    model = request.app[keys.MODEL_NAME]
    return web.json_response(completion(completion_id(), model, message, gen.result.finish_reason, _usage(gen)))


async def stream_reply(
    request: web.Request, include_usage: bool, gen: Generation, started: Callable[[], None] | None = None
) -> web.StreamResponse:
    """SSE exactly as OpenAI frames it; headers go out with the first event, so an engine failure
    before any output is still a plain HTTP error with its status code. ``started`` is called
    once that first event was written."""
    frames = ChunkFrames(completion_id(), request.app[keys.MODEL_NAME], int(time.time()), include_usage)
    response: web.StreamResponse | None = None

    async def send(data: bytes, last: bool = False) -> None:
        nonlocal response
        first = response is None
        if first:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            data = frames.delta({"role": "assistant", "content": ""}) + data
        if last:
            await response.write_eof(data)  # one write: the data and the end of the chunked body
        else:
            await response.write(data)
        if first and started is not None:
            started()

    try:
        async for event in gen.events():
            await send(frames.delta(_event_delta(event)))
        tail = frames.delta({}, gen.result.finish_reason)
        if include_usage:
            tail += frames.usage(_usage(gen))
        await send(tail + b"data: [DONE]\n\n", last=True)
    except APIError as err:
        if response is None:
            raise
        await _write_quietly(response, b"data: " + json.dumps(err.body()).encode() + b"\n\n" + b"data: [DONE]\n\n")
        raise _StreamAlreadyAnswered(response) from err
    except _DISCONNECTS:
        if not gen.finished:
            asyncio.ensure_future(gen.engine.abort(gen.rid))
        raise
    return response


class _StreamAlreadyAnswered(Exception):
    """A failure after the SSE headers went out: the error was sent in-stream; nothing to record."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("stream failed after it started")
        self.response = response


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except _DISCONNECTS[:2]:
        pass


def _event_delta(event) -> dict[str, Any]:
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, ToolCallStart):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function", "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ToolCallArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.arguments}}]}
    raise TypeError(f"unknown relay event {event!r}")


async def handle(request: web.Request) -> web.StreamResponse:
    try:
        return await chat_completions(request)
    except _StreamAlreadyAnswered as done:
        return done.response
    # The same two, hidden inside strings the sidecar parses itself (tool-call arguments): text with
    # unpaired surrogates, nesting past the recursion limit. The client's fault: 400, not 500.
    except UnicodeError:
        raise invalid_request("request holds text that is not valid Unicode (an unpaired surrogate)") from None
    except RecursionError:
        raise invalid_request("request is nested too deeply") from None

"""The wire protocols the replay speaks: raw SGLang /generate, OpenAI /v1/chat/completions and
Anthropic /v1/messages.

A client keeps each session's conversation and turns one trace round into one streamed request,
filling a TurnRecord. It never raises for HTTP or protocol errors: the turn is recorded as failed
and the conversation still grows by the planned amount, so the session can go on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import aiohttp

from sidecar_tools.benchmarks.records import TurnRecord
from sidecar_tools.benchmarks.textgen import TextSource, token_ids
from sidecar_tools.benchmarks.traces import Round, Session, Trace
from sglang_ext.wire import lease_params


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """Decoded ``data:`` payloads of a server-sent-event stream (no line-length limit)."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            yield json.loads(payload)
    tail = buf.strip()
    if tail.startswith(b"data:") and tail[5:].strip() not in (b"", b"[DONE]"):
        yield json.loads(tail[5:].strip())


class TurnFailed(Exception):
    pass


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or obj)


@dataclass
class ClientOptions:
    lease_ttl_s: float | None = None
    send_session_id: bool = True
    body_session_id: bool = False  # OpenAI mode: also put session_id in the body (SGLang's own API)
    close_sessions: bool = False
    request_timeout_s: float = 300.0
    salt: str = ""
    model: str = "default"
    tools: bool = True
    extra_sampling: dict[str, Any] = field(default_factory=dict)


class BaseClient:
    def __init__(self, http: aiohttp.ClientSession, url: str, trace: Trace, opts: ClientOptions):
        self.http, self.url, self.trace, self.opts = http, url.rstrip("/"), trace, opts
        self.t0 = time.monotonic()

    def session_id(self, session: Session) -> str:
        return f"{session.session_id}{'-' + self.opts.salt if self.opts.salt else ''}"

    def now(self) -> float:
        return time.monotonic() - self.t0

    def timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.opts.request_timeout_s, sock_connect=10)

    async def finish(self, session: Session) -> None:
        """End of a session: release its engine state if asked to."""
        if not self.opts.close_sessions:
            return
        try:
            async with self.http.post(f"{self.url}/close_session", json={"session_id": self.session_id(session)},
                                      timeout=aiohttp.ClientTimeout(total=30)) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass


# --------------------------------------------------------------------------------------------
# raw /generate with token ids


@dataclass
class IdsConversation:
    session: Session
    ids: list[int] = field(default_factory=list)


class GenerateClient(BaseClient):
    """History ids grow by the exact prompt + output ids each turn, plus synthetic tool-result ids."""

    def start(self, session: Session) -> IdsConversation:
        return IdsConversation(session)

    def history_tokens(self, conv: IdsConversation) -> int:
        return len(conv.ids)

    def new_ids(self, conv: IdsConversation, k: int, rnd: Round) -> list[int]:
        sid = self.session_id(conv.session)
        if k == 0:
            shared = min(self.trace.shared_prefix_tokens, rnd.append_tokens)
            return token_ids(f"{self.trace.name}/{self.opts.salt}/system", shared) + \
                token_ids(f"{sid}/task", rnd.append_tokens - shared)
        return token_ids(f"{sid}/r{k}", rnd.append_tokens)

    def body(self, conv: IdsConversation, ids: list[int], rnd: Round) -> dict[str, Any]:
        sampling: dict[str, Any] = {"max_new_tokens": rnd.output_tokens, "ignore_eos": True,
                                    **self.opts.extra_sampling}
        if self.opts.lease_ttl_s is not None:
            sampling["custom_params"] = lease_params(self.opts.lease_ttl_s)
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": sampling, "stream": True}
        if self.opts.send_session_id:
            body["session_id"] = self.session_id(conv.session)
        return body

    async def turn(self, conv: IdsConversation, k: int, rnd: Round, rec: TurnRecord) -> None:
        ids = conv.ids + self.new_ids(conv, k, rnd)
        output: list[int] = []
        rec.send_s = self.now()
        try:
            async with self.http.post(f"{self.url}/generate", json=self.body(conv, ids, rnd),
                                      timeout=self.timeout()) as resp:
                if resp.status != 200:
                    raise TurnFailed(f"http {resp.status}: {(await resp.text())[:200]}")
                meta: dict[str, Any] = {}
                async for ev in sse_events(resp):
                    if "error" in ev:
                        raise TurnFailed(f"stream error: {_error_text(ev)[:200]}")
                    output = _merge_output_ids(output, ev.get("output_ids") or [])
                    if output and rec.ttft_s is None:
                        rec.ttft_s = self.now() - rec.send_s
                    meta = ev.get("meta_info") or meta
                finish = meta.get("finish_reason") or {}
                if isinstance(finish, dict) and finish.get("type") == "abort":
                    raise TurnFailed(f"aborted: {str(finish.get('message'))[:200]}")
                rec.prompt_tokens = int(meta.get("prompt_tokens", len(ids)))
                rec.cached_tokens = int(meta.get("cached_tokens", 0))
                rec.completion_tokens = int(meta.get("completion_tokens", len(output)))
                rec.ok = True
        except TurnFailed as e:
            rec.error = str(e)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            rec.error = f"{type(e).__name__}: {e}"[:300]
        rec.end_s = self.now()
        if not rec.ok:  # keep the planned shape: complete the reply with synthetic ids
            filler = token_ids(f"{self.session_id(conv.session)}/o{k}", rnd.output_tokens)
            output = output + filler[len(output):]
        conv.ids = ids + output


def _merge_output_ids(acc: list[int], new: list[int]) -> list[int]:
    """SGLang streams cumulative output_ids by default, deltas with --incremental-streaming-output."""
    if len(new) >= len(acc) and new[: len(acc)] == acc:
        return list(new)
    return acc + list(new)


# --------------------------------------------------------------------------------------------
# an agent's conversation: OpenAI /v1/chat/completions, Anthropic /v1/messages


TOOLS = [
    {"type": "function", "function": {
        "name": "execute_bash", "description": "Run a bash command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace_editor", "description": "View, create or edit a file.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace"]},
            "path": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"}},
            "required": ["command", "path"]}}},
]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


@dataclass
class ChatConversation:
    session: Session
    messages: list[dict[str, Any]] = field(default_factory=list)
    history: int = 0  # prompt + completion tokens of the last successful turn
    last_call_ids: list[str] = field(default_factory=list)
    system: str | None = None  # Anthropic: the system prompt rides beside the messages


@dataclass
class Reply:
    """What a streamed reply carried so far (also when the stream failed midway)."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, name, arguments (JSON text)

    def call(self, index: int) -> dict[str, str]:
        return self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})


class AgentClient(BaseClient):
    """Messages an agent would send: system, task, then assistant replies and tool results (in the
    door's wire format: :meth:`round_messages`, :meth:`reply_message`, :meth:`exchange`)."""

    def __init__(self, *args: Any, text: TextSource | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.text = text or TextSource()

    def start(self, session: Session) -> ChatConversation:
        return ChatConversation(session)

    def history_tokens(self, conv: ChatConversation) -> int:
        return conv.history

    def round_texts(self, conv: ChatConversation, k: int, rnd: Round) -> tuple[str | None, str]:
        """(the system prompt: round 0 with a shared prefix only, the round's own text)."""
        sid = self.session_id(conv.session)
        if k == 0:
            shared = min(self.trace.shared_prefix_tokens, rnd.append_tokens)
            system = self.text.text(f"{self.trace.name}/{self.opts.salt}/system", shared) if shared else None
            return system, self.text.text(f"{sid}/task", rnd.append_tokens - shared)
        return None, self.text.text(f"{sid}/r{k}", rnd.append_tokens)

    def headers(self, conv: ChatConversation) -> dict[str, str]:
        return {"X-Session-Id": self.session_id(conv.session)} if self.opts.send_session_id else {}

    async def turn(self, conv: ChatConversation, k: int, rnd: Round, rec: TurnRecord) -> None:
        conv.messages.extend(self.round_messages(conv, k, rnd))
        reply = Reply()
        rec.send_s = self.now()
        try:
            await self.exchange(conv, rnd, rec, reply)
            rec.ok = True
            conv.history = rec.prompt_tokens + rec.completion_tokens
        except TurnFailed as e:
            rec.error = str(e)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            rec.error = f"{type(e).__name__}: {e}"[:300]
        rec.end_s = self.now()
        if not rec.ok and not reply.text:  # keep the planned shape: the reply the trace planned
            reply.text.append(self.text.text(f"{self.session_id(conv.session)}/o{k}", rnd.output_tokens))
        conv.messages.append(self.reply_message(reply))
        conv.last_call_ids = [c["id"] for c in (reply.calls[i] for i in sorted(reply.calls)) if c["id"]]

    async def post_stream(self, path: str, body: dict[str, Any], conv: ChatConversation) -> AsyncIterator[Any]:
        """The decoded SSE payloads of one streamed request (TurnFailed for an HTTP or in-stream error)."""
        async with self.http.post(f"{self.url}{path}", json=body, headers=self.headers(conv), timeout=self.timeout()) as resp:
            if resp.status != 200:
                raise TurnFailed(f"http {resp.status}: {(await resp.text())[:200]}")
            async for ev in sse_events(resp):
                if isinstance(ev, dict) and "error" in ev:
                    raise TurnFailed(f"stream error: {_error_text(ev)[:200]}")
                yield ev


class OpenAIClient(AgentClient):
    """/v1/chat/completions: replies with their tool calls, results as role ``tool`` messages."""

    def round_messages(self, conv: ChatConversation, k: int, rnd: Round) -> list[dict[str, Any]]:
        system, body = self.round_texts(conv, k, rnd)
        if k == 0:
            return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": body}]
        if not conv.last_call_ids:
            return [{"role": "user", "content": body}]
        return [{"role": "tool", "tool_call_id": cid, "content": body if i == 0 else "ok"}
                for i, cid in enumerate(conv.last_call_ids)]

    def body(self, conv: ChatConversation, rnd: Round) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.opts.model, "messages": conv.messages, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": rnd.output_tokens, "ignore_eos": True,
            **self.opts.extra_sampling,
        }
        if self.opts.tools:
            body["tools"] = TOOLS
        if self.opts.body_session_id:
            body["session_id"] = self.session_id(conv.session)
        return body

    async def exchange(self, conv: ChatConversation, rnd: Round, rec: TurnRecord, reply: Reply) -> None:
        usage: dict[str, Any] = {}
        async for ev in self.post_stream("/v1/chat/completions", self.body(conv, rnd), conv):
            usage = ev.get("usage") or usage
            for choice in ev.get("choices") or []:
                if _collect_delta(choice.get("delta") or {}, reply) and rec.ttft_s is None:
                    rec.ttft_s = self.now() - rec.send_s
        if not usage:
            raise TurnFailed("no usage in stream (stream_options.include_usage unsupported?)")
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.completion_tokens = int(usage.get("completion_tokens") or 0)
        rec.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    def reply_message(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.text)}
        if reply.calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                                     for c in (reply.calls[i] for i in sorted(reply.calls))]
        return message


def _collect_delta(delta: dict[str, Any], reply: Reply) -> bool:
    """Accumulate one streamed delta; True when it carried generated output."""
    got = False
    if delta.get("content"):
        reply.text.append(delta["content"])
        got = True
    if delta.get("reasoning_content"):
        got = True
    for tc in delta.get("tool_calls") or []:
        got = True
        slot = reply.call(int(tc.get("index", 0)))
        slot["id"] = tc.get("id") or slot["id"]
        fn = tc.get("function") or {}
        slot["name"] += fn.get("name") or ""
        slot["arguments"] += fn.get("arguments") or ""
    return got


class AnthropicClient(AgentClient):
    """/v1/messages (what Claude Code speaks): the system prompt beside the messages, replies as
    content blocks, results as ``tool_result`` blocks. Usage: the prompt is input + cache reads
    (+ cache writes), the cached part the cache reads."""

    def round_messages(self, conv: ChatConversation, k: int, rnd: Round) -> list[dict[str, Any]]:
        system, body = self.round_texts(conv, k, rnd)
        if k == 0:
            conv.system = system
        if not conv.last_call_ids:
            return [{"role": "user", "content": body}]
        return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": body if i == 0 else "ok"}
                                             for i, cid in enumerate(conv.last_call_ids)]}]

    def body(self, conv: ChatConversation, rnd: Round) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.opts.model, "messages": conv.messages, "max_tokens": rnd.output_tokens,
                                "stream": True, "ignore_eos": True, **self.opts.extra_sampling}
        if conv.system:
            body["system"] = conv.system
        if self.opts.tools:
            body["tools"] = ANTHROPIC_TOOLS
        return body

    async def exchange(self, conv: ChatConversation, rnd: Round, rec: TurnRecord, reply: Reply) -> None:
        usage: dict[str, Any] = {}
        stopped = False
        async for ev in self.post_stream("/v1/messages", self.body(conv, rnd), conv):
            kind = ev.get("type")
            if kind == "message_start":
                usage = (ev.get("message") or {}).get("usage") or usage
            elif kind == "content_block_start":
                block = ev.get("content_block") or {}
                if block.get("type") == "tool_use":
                    reply.call(int(ev["index"])).update(id=block.get("id") or "", name=block.get("name") or "")
            elif kind == "content_block_delta":
                delta = ev.get("delta") or {}
                if delta.get("type") == "text_delta":
                    reply.text.append(delta.get("text") or "")
                elif delta.get("type") == "input_json_delta":
                    reply.call(int(ev["index"]))["arguments"] += delta.get("partial_json") or ""
                if rec.ttft_s is None:
                    rec.ttft_s = self.now() - rec.send_s
            elif kind == "message_delta":
                usage = {**usage, **{k: v for k, v in (ev.get("usage") or {}).items() if v is not None}}
            elif kind == "message_stop":
                stopped = True
        if not stopped:
            raise TurnFailed("stream ended without message_stop")
        cached = int(usage.get("cache_read_input_tokens") or 0)
        rec.prompt_tokens = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
        rec.cached_tokens = cached
        rec.completion_tokens = int(usage.get("output_tokens") or 0)

    def reply_message(self, reply: Reply) -> dict[str, Any]:
        text = "".join(reply.text)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for i in sorted(reply.calls):
            call = reply.calls[i]
            try:
                arguments = json.loads(call["arguments"]) if call["arguments"] else {}
            except ValueError:
                arguments = {}
            content.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": arguments})
        return {"role": "assistant", "content": content}

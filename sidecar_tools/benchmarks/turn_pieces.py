"""What each piece of one sidecar turn costs, in process, hot, next to the alternative it replaced.

The load test (``benchmarks/load_benchmark.py``) measures the sidecar as a whole; this times the pieces
of its turn on the same turn shape (system prompt of 1,000 tokens + one tool, ten turns of a short
reply with a ``bash`` call and a 100-token tool result) so that the per-piece figures in
``benchmarks/results/load/README.md`` have a command behind them:

    python -m sidecar_tools.benchmarks.turn_pieces --out benchmarks/results/load/turn-pieces.json

Each figure is the median of ``--repeat`` timed loops of ``--number`` calls (hot: caches warm, no
other load; a loaded server runs the same code slower). Where a piece has an alternative
(the call it replaced, or one that was not taken), both are timed on the same input and the
alternative is checked to give the same result.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import click


def _time(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Median seconds per call."""
    fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def _turn_shape(tokenizer_dir: str) -> dict[str, Any]:
    """The load test's conversation at its tenth turn, as the agent sends it."""
    from sidecar_tools.benchmarks.load_benchmark import LOAD_MODEL, REPLY_CALL, REPLY_TEXT, TOOLS
    from sidecar_tools.benchmarks.textgen import TextSource

    source = TextSource(tokenizer_dir)
    system = "You are a coding agent. " + source.text("load-system", 1000)
    tools_text = [source.text(f"load-tool-{i}", 100) for i in range(9)]
    call = json.dumps({"cmd": "pytest -x tests/test_api.py -q"})
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": "Fix the failing test."}]
    for k in range(9):
        reply_call = {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": call}}
        messages.append({"role": "assistant", "content": REPLY_TEXT, "tool_calls": [reply_call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": tools_text[k]})
    body = {"model": LOAD_MODEL, "messages": messages, "tools": TOOLS, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": 44}
    return {"body": body, "raw": json.dumps(body).encode(), "reply": REPLY_TEXT + "\n" + REPLY_CALL}


def template_text(tok, messages: list[dict], tools) -> str:
    """The chat template's text of ``messages`` with the generation prompt, as the sidecar's
    renderer asks the tokenizer for it (``ChatRenderer`` renders through ``apply_chat_template``)."""
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def sandboxed_template(source: str):
    """The chat template compiled as transformers' ``apply_chat_template`` compiles it (its
    documented environment: sandboxed, trim/lstrip blocks, loop controls, a non-escaping ``tojson``,
    ``raise_exception``, ``strftime_now``), built from jinja2's own API; ``measure`` checks it
    renders the text ``apply_chat_template`` does, so it times that Jinja render alone."""
    import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def backend_ids(tok, text: str) -> list[int]:
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def measure(tokenizer_dir: str, number: int, repeat: int) -> dict[str, Any]:
    import jinja2
    import pydantic_core
    from transformers import AutoTokenizer

    from sidecar.conversation.chat_template import ChatRenderer
    from sidecar.conversation.fingerprint import fingerprints
    from sidecar.errors import LONE_SURROGATE
    from sidecar.id_text import IdText
    from sidecar.openai.schema import ChatCompletionRequest, parse_chat_request
    from sidecar.server.request_body import parse_strict_json
    from sidecar.settings import ServerSettings
    from sidecar.openai.shapes import ChunkFrames

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    renderer = ChatRenderer(tok)
    shape = _turn_shape(tokenizer_dir)
    raw = shape["raw"]
    limits = ServerSettings()

    def parse(body: bytes):  # what the chat route does: the shared reader's strict JSON, then the schema
        return parse_chat_request(parse_strict_json(body), limits)

    req = parse(raw)
    messages = [m.to_template() for m in req.messages]
    tools = req.template_tools()
    out: dict[str, Any] = {"body_bytes": len(raw), "messages": len(messages)}

    def piece(name: str, fn: Callable[[], Any], n: int = number) -> float:
        out[name] = round(_time(fn, n, repeat) * 1e6, 2)  # microseconds
        return out[name]

    # body: what the chat route does (strict: duplicate keys refused, strict types) vs one lax pass
    assert ChatCompletionRequest.model_validate_json(raw) == req
    piece("body_strict_parse_validate_us", lambda: parse(raw))
    piece("body_parse_validate_one_pass_us", lambda: ChatCompletionRequest.model_validate_json(raw))
    piece("body_json_loads_then_validate_us", lambda: ChatCompletionRequest.model_validate(json.loads(raw)))
    piece("template_dicts_us", lambda: [m.to_template() for m in req.messages])
    piece("fingerprints_whole_history_us", lambda: fingerprints(messages))

    # the new messages of a continued turn: render (Jinja) and tokenize
    new = messages[-1:]
    piece("render_suffix_total_us", lambda: renderer.render_suffix(new, 151645, tools))
    anchor = [{"role": "user", "content": "."}, {"role": "assistant", "content": "\u2063m\u2063"}] + new
    sandboxed = sandboxed_template(tok.chat_template)
    plain_env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[type(e) for e in sandboxed.environment.extensions.values()])
    plain_env.filters.update(sandboxed.environment.filters)
    plain_env.globals.update(sandboxed.environment.globals)
    plain = plain_env.from_string(tok.chat_template)
    variables = {"messages": anchor, "tools": tools, "add_generation_prompt": True, **tok.special_tokens_map}
    assert plain.render(**variables) == sandboxed.render(**variables) == template_text(tok, anchor, tools)
    piece("jinja_render_sandboxed_us", lambda: sandboxed.render(**variables))
    piece("jinja_render_unsandboxed_not_used_us", lambda: plain.render(**variables))
    text = template_text(tok, anchor, tools).split("\u2063m\u2063", 1)[1].removeprefix("<|im_end|>")
    assert backend_ids(tok, text) == renderer.render_suffix(new, 151645, tools)  # what the turn encodes
    backend = tok.backend_tokenizer
    ids = backend.encode(text, add_special_tokens=False).ids
    assert backend.encode_batch_fast([text], add_special_tokens=False)[0].ids == ids == list(tok.encode(text, add_special_tokens=False))
    out["suffix_tokens"] = len(ids)
    piece("encode_transformers_us", lambda: tok.encode(text, add_special_tokens=False))
    piece("encode_backend_us", lambda: backend.encode(text, add_special_tokens=False).ids)
    piece("encode_backend_batch_fast_us", lambda: backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)
    piece("decode_transformers_us", lambda: tok.decode(ids[:4], skip_special_tokens=True))
    piece("decode_backend_us", lambda: backend.decode(ids[:4], skip_special_tokens=True))

    # a new session: the shared system block's ids from the cache vs encoding the whole render
    first = messages[:2]
    renderer.render_full(first, tools)  # fills the cache
    whole = template_text(tok, first, tools)
    assert renderer.render_full(first, tools) == renderer.encode(whole)
    piece("new_session_render_with_head_cache_us", lambda: renderer.render_full(first, tools), max(1, number // 4))
    piece("new_session_render_encode_whole_us", lambda: renderer.encode(template_text(tok, first, tools)), max(1, number // 4))

    # the engine payload: the session's ids kept as JSON text vs JSON of the whole list every turn
    history = list(range(1000, 1000 + 2500))
    held = IdText(history)
    piece("payload_ids_json_whole_history_us", lambda: json.dumps(history).encode())
    piece("payload_ids_idtext_append_us", lambda: (held + ids).json())

    # per streamed chunk: SGLang's cumulative chunk in, one SSE frame out
    chunk_line = json.dumps({"text": "", "output_ids": list(range(151000, 151020)), "meta_info": {
        "id": "x" * 32, "finish_reason": None, "prompt_tokens": 2500, "completion_tokens": 20, "cached_tokens": 2400}}).encode()
    assert pydantic_core.from_json(chunk_line) == json.loads(chunk_line)
    piece("chunk_parse_json_loads_us", lambda: json.loads(chunk_line), number * 10)
    piece("chunk_parse_pydantic_core_us", lambda: pydantic_core.from_json(chunk_line), number * 10)
    frames = ChunkFrames("chatcmpl-" + "a" * 32, "load", 1_700_000_000, True)
    piece("sse_frame_us", lambda: frames.delta({"content": " failing"}), number * 10)

    # the policy's work on a request's way to the engine (default settings: gap learning, lease)
    out.update(_policy_per_request(number, repeat))
    # the relay of one whole reply (36 chunks of cumulative ids): parse, detokenize, tool call, frames
    piece("relay_whole_reply_us", _relay(renderer, tok.encode(shape["reply"], add_special_tokens=False) + [151645], frames), max(1, number // 4))

    # the lone-surrogate check on a body holding a \uD escape (60 KB)
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * 60_000 + b'\\ud83d\\ude00"}]}'
    piece("lone_surrogate_regex_60kb_us", lambda: LONE_SURROGATE.search(big), max(1, number // 4))
    return out


def _policy_per_request(number: int, repeat: int) -> dict[str, float]:
    """A turn's policy calls as its request leaves (``turn_started``: on_request + lease_request) for
    500 sessions (in a session store) taking turns, each after its reply ended."""
    from sidecar.conversation.store import SessionStore
    from sidecar.policy import EngineCapacity, TurnEnd, build_policy
    from sidecar.settings import SidecarSettings
    from sidecar.turn.policy_calls import turn_started

    figures = {}
    for mode in ("off", "predictive"):
        settings = SidecarSettings.model_validate({"policy": {"mode": mode}})
        clock = [1000.0]
        policy = build_policy(settings, EngineCapacity(max_total_num_tokens=10_000_000), clock=lambda: clock[0])
        store = SessionStore(policy)
        for i in range(500):
            store.open(f"s{i}")
        per_repeat = []
        for _ in range(repeat + 1):  # the first pass warms up (every session gets a history)
            spent = 0.0
            for i in range(number):
                sid, now = f"s{i % 500}", clock[0]
                start = time.perf_counter()
                turn_started(policy, sid, 3000, now)  # what a turn asks of the policy as its request leaves
                spent += time.perf_counter() - start
                clock[0] += 0.004
                policy.on_turn_end(TurnEnd(sid, 3150, ["bash"], clock[0]))  # after the reply: not timed
            per_repeat.append(spent / number)
        figures[f"policy_request_{mode}_us"] = round(statistics.median(per_repeat[1:]) * 1e6, 2)
    return figures


def _relay(renderer, reply_ids: list[int], frames) -> Callable[[], Any]:
    from sidecar.engine.client import sse_event
    from sidecar.generation.relay import Generation
    from sidecar.generation.tool_parsers import get_tool_parser

    lines = []
    for n in range(1, len(reply_ids) + 1):
        finish = {"type": "stop", "matched": reply_ids[-1]} if n == len(reply_ids) else None
        chunk = {"text": "", "output_ids": reply_ids[:n], "meta_info": {"id": "r", "finish_reason": finish,
                 "prompt_tokens": 2500, "completion_tokens": n, "cached_tokens": 2400}}
        lines.append(b"data: " + json.dumps(chunk).encode())

    class Engine:
        async def generate_batches(self, payload):  # a chunk a read, as an idle sidecar reads them
            for line in lines:
                yield [sse_event(line)]

    def run() -> None:
        """One reply, driven without an event loop: nothing in it really waits."""
        gen = Generation(Engine(), {"rid": "r", "input_ids": [1]}, renderer.codec, get_tool_parser("hermes"), None)
        events = gen.events()
        while True:
            try:
                events.__anext__().send(None)
            except StopIteration as produced:
                frames.delta({"content": getattr(produced.value, "text", "")})
            except StopAsyncIteration:
                return

    return run


@click.command()
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False), help="Default: the Qwen3 tokenizer built offline.")
@click.option("--number", default=400, show_default=True, help="Calls per timed loop.")
@click.option("--repeat", default=7, show_default=True, help="Timed loops per piece (the median is reported).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the figures as JSON.")
def main(tokenizer_dir: str | None, number: int, repeat: int, out: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="pieces-tok-") as tmp:
        if tokenizer_dir is None:
            from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

            tokenizer_dir = str(build_qwen3_tokenizer(Path(tmp)))
        figures = measure(tokenizer_dir, number, repeat)
    result = {"figures": figures, "number": number, "repeat": repeat, "python": platform.python_version(),
              "command": "python -m sidecar_tools.benchmarks.turn_pieces" + (f" --out {out}" if out else "")}
    for name, value in figures.items():
        click.echo(f"{name:42s} {value}")
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

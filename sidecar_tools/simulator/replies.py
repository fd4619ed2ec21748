"""What the simulated model says, and where SGLang makes it stop.

A *responder* is the model: ``responder(input_ids, sampling_params) -> ids`` (may be async).
``plan_reply`` then applies SGLang's stop rules to whatever it returned, as the scheduler's
``Req.check_finished`` does: the first EOS id (the model's, plus ``stop_token_ids``) ends the reply
and is kept in ``output_ids``, ``ignore_eos`` disables both, ``max_new_tokens`` caps the length.
``stop`` strings need a tokenizer and are refused earlier (``generate_request``). No sglang import.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

IM_END_ID = 151645  # Qwen3's <|im_end|>
ENDOFTEXT_ID = 151643  # Qwen3's <|endoftext|>
DEFAULT_EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)  # generation_config.json of Qwen3
QWEN3_NUM_BPE_TOKENS = 151643  # ids below this are plain BPE tokens, never special

Responder = Callable[[list[int], dict[str, Any]], list[int] | Awaitable[list[int]]]


def random_responder(seed: int = 0, vocab: tuple[int, int] = (0, QWEN3_NUM_BPE_TOKENS)) -> Responder:
    """Dummy weights decoding greedily: the same prompt (and seed) gives the same reply.

    ``max_new_tokens`` plain ids in ``[vocab[0], vocab[1])``, never a special id, so generation
    ends with ``length`` unless the client adds ``stop_token_ids``."""
    low, high = vocab

    def responder(input_ids: list[int], sampling_params: dict[str, Any]) -> list[int]:
        digest = hashlib.sha256(f"{seed}:{input_ids}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        count = sampling_params.get("max_new_tokens")
        return [rng.randrange(low, high) for _ in range(128 if count is None else count)]

    return responder


def scripted_responder(*outputs: list[int]) -> Responder:
    """The given id lists, one per request, in order; the last one repeats.

    E.g. ``scripted_responder(tok.encode('<tool_call>...</tool_call>') + [IM_END_ID])``."""
    if not outputs:
        raise ValueError("scripted_responder needs at least one reply")
    queue = [list(o) for o in outputs]

    def responder(input_ids: list[int], sampling_params: dict[str, Any]) -> list[int]:
        return list(queue.pop(0) if len(queue) > 1 else queue[0])

    return responder


def plan_reply(raw: list[int], sampling_params: dict[str, Any], max_new_tokens: int,
               eos_token_ids: tuple[int, ...] = DEFAULT_EOS_IDS) -> tuple[list[int], dict[str, Any]]:
    """(the ids SGLang would emit, its finish reason) for a model that would say ``raw``.

    A reply that runs dry before any stop finishes with ``length`` at its own length."""
    stop_ids: set[int] = set()
    if not sampling_params.get("ignore_eos"):
        stop_ids = set(eos_token_ids) | set(sampling_params.get("stop_token_ids") or [])
    planned: list[int] = []
    for token in list(raw)[:max_new_tokens]:
        planned.append(int(token))
        if token in stop_ids:
            return planned, {"type": "stop", "matched": int(token)}
    return planned, {"type": "length", "length": len(planned)}


# ---------------------------------------------------------------- the demo's agent model
AGENT_ANSWER = "Done."  # how every final answer of the agent responder begins
_SHELL_TOOLS = ("bash", "exec_command", "shell", "shell_command", "local_shell", "run_command", "run_shell_command", "terminal")
_QUOTED_CHARS = 60  # of a tool result's last line, quoted in the final answer


def agent_responder(tokenizer, eos_id: int = IM_END_ID) -> Responder:
    """A deterministic stand-in for an agent's model (the demo's), reading the prompt as Qwen3's
    chat template renders it: to a user's turn it answers with one well-formed ``<tool_call>`` to a
    tool the request offers (a shell tool with ``ls`` where there is one), to a tool result with a
    short final answer, and without tools with the final answer at once; every reply ends with EOS.
    A forced tool call (the prompt ends inside ``<tool_call>``) is completed. Replies are a few
    dozen tokens, so a whole tool loop takes seconds at the cost model's speed."""

    def responder(input_ids: list[int], sampling_params: dict[str, Any]) -> list[int]:
        text = agent_reply(tokenizer.decode(input_ids))
        return list(tokenizer.encode(text, add_special_tokens=False)) + [eos_id]

    return responder


def agent_reply(prompt: str) -> str:
    """The text the agent responder says after ``prompt`` (a rendered chat, generation prompt last)."""
    tools = _offered_tools(prompt)
    head, _, opened = prompt.rpartition("<|im_start|>assistant\n")
    if "<tool_call>" in opened:  # the sidecar prefilled a forced call: '{"name": "X", "arguments": '
        name = opened.split('"name": "', 1)[-1].split('"', 1)[0]
        tool = next((t for t in tools if t.get("name") == name), {"name": name})
        return json.dumps(_arguments(tool)) + "}\n</tool_call>"
    turns = [t for t in head.split("<|im_start|>")[1:] if not t.startswith("system")]
    last_turn = turns[-1] if turns else ""  # system turns after it (Claude Code sends some) aside
    if "<tool_response>" in last_turn:
        result = last_turn.split("<tool_response>", 1)[1].split("</tool_response>", 1)[0].strip()
        lines = [line for line in result.splitlines() if line.strip()]
        last = lines[-1] if lines else ""  # a shell tool's output ends with what the command printed
        quoted = "".join(c for c in last[:_QUOTED_CHARS] if c not in "<>|")
        return f"{AGENT_ANSWER} The tool said: {quoted}" if quoted else f"{AGENT_ANSWER} The tool said nothing."
    if not tools or not last_turn.startswith("user"):
        return f"{AGENT_ANSWER} Nothing to run."
    tool = _pick_tool(tools)
    call = {"name": tool["name"], "arguments": _arguments(tool)}
    return f"Let me look.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _offered_tools(prompt: str) -> list[dict[str, Any]]:
    """The function definitions between ``<tools>`` and ``</tools>`` (one JSON object a line)."""
    if "<tools>\n" not in prompt:  # the template first names the tags in a sentence: "within <tools></tools>"
        return []
    block = prompt.split("<tools>\n", 1)[1].split("</tools>", 1)[0]
    tools = []
    for line in block.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools.append(function)
    return tools


def _pick_tool(tools: list[dict[str, Any]]) -> dict[str, Any]:
    for tool in tools:
        if tool["name"].lower() in _SHELL_TOOLS:
            return tool
    return tools[0]


def _arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """A value for each required parameter, by its name and type (a shell command is ``ls``)."""
    schema = tool.get("parameters") or {}
    props = schema.get("properties") or {}
    return {name: _value(name, props.get(name) or {}) for name in schema.get("required") or []}


def _value(name: str, prop: dict[str, Any]) -> Any:
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if prop.get("enum"):
        return prop["enum"][0]
    if name in ("command", "cmd"):
        return ["ls"] if kind == "array" else "ls"
    defaults = {"integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}
    if kind in defaults:
        return defaults[kind]
    return {"pattern": "*", "path": ".", "file_path": ".", "description": "list the files"}.get(name, "demo")

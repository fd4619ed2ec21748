"""A multi-turn streaming agent conversation through the official `openai` client.

Checks the sidecar's promise end to end: from turn 2 on, the engine reports the previous turn's
prompt + completion - 1 tokens as cached, all it can hold (history is continued token-exactly,
never re-rendered).
The client appends each reply and a tool result, as an agent does.

    python -m sidecar_tools.benchmarks.sidecar_turns --base-url http://127.0.0.1:8000/v1 --turns 5 --out result.json
"""

from __future__ import annotations

import json
import sys
import time

import click

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


def tool_output(turn: int) -> str:
    lines = [f"src/module_{turn}_{i}.py:{i * 7 + 3}: def handler_{i}(request): return process(request, {i})" for i in range(40)]
    return "\n".join(lines)


def run(base_url: str, turns: int, max_tokens: int, session_id: str | None) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused")
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool to inspect the repository."},
        {"role": "user", "content": "Find where requests are handled and explain the flow."},
    ]
    headers = {"X-Session-Id": session_id} if session_id else None
    rows = []
    for turn in range(1, turns + 1):
        started = time.monotonic()
        first = None
        content, calls, usage, finish = "", {}, None, None
        stream = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=messages,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
            extra_headers=headers,
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if first is None and (choice.delta.content or choice.delta.tool_calls):
                    first = time.monotonic() - started
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}})
                    if call.function and call.function.name:
                        slot["function"]["name"] = call.function.name
                    if call.function and call.function.arguments:
                        slot["function"]["arguments"] += call.function.arguments
                finish = choice.finish_reason or finish
        reply: dict = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [calls[i] for i in sorted(calls)]
        messages.append(reply)
        call_id = reply["tool_calls"][0]["id"] if calls else f"call_{turn}"
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(turn)})
        rows.append(
            {
                "turn": turn,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                "finish_reason": finish,
                "ttft_s": round(first or 0.0, 4),
                "seconds": round(time.monotonic() - started, 4),
            }
        )
    mark_reuse(rows)
    return rows


def mark_reuse(rows: list[dict]) -> None:
    """From turn 2 on: the cached tokens the engine can at best report, and whether it did.

    The best is the previous turn's prompt + completion - 1: SGLang never computes the KV of the
    last sampled token (it is the next turn's first input), so one less is the whole history."""
    for prev, row in zip(rows, rows[1:]):
        row["expected_cached"] = prev["prompt_tokens"] + prev["completion_tokens"] - 1
        row["history_reused"] = row["cached_tokens"] >= row["expected_cached"]


def format_table(rows: list[dict]) -> str:
    lines = [f"{'turn':>4} {'prompt':>7} {'completion':>10} {'cached':>7} {'expected':>8} {'reused':>6}"]
    for r in rows:
        lines.append(
            f"{r['turn']:>4} {r['prompt_tokens']:>7} {r['completion_tokens']:>10} {r['cached_tokens']:>7} "
            f"{r.get('expected_cached', '-'):>8} {str(r.get('history_reused', '-')):>6}"
        )
    lines.append("expected = previous prompt + completion - 1 (SGLang never computes the KV of the last sampled token)")
    return "\n".join(lines)


@click.command()
@click.option("--base-url", default="http://127.0.0.1:8000/v1")
@click.option("--turns", default=5, show_default=True)
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--session-id", default=None, help="Send X-Session-Id (default: implicit recognition).")
@click.option("--out", default=None, help="Write the rows as JSON here.")
def main(base_url: str, turns: int, max_tokens: int, session_id: str | None, out: str | None) -> None:
    rows = run(base_url, turns, max_tokens, session_id)
    click.echo(format_table(rows))
    reused = all(r.get("history_reused", True) for r in rows)
    if out:
        with open(out, "w") as f:
            json.dump({"base_url": base_url, "turns": rows, "history_reused": reused}, f, indent=2)
    sys.exit(0 if reused else 1)


if __name__ == "__main__":
    main()

"""What recognising and preparing a continuing turn costs against the length of its history, in
process: the session store, fingerprints and the chat template of the sidecar, the Qwen3 tokenizer.

    python -m sidecar_tools.benchmarks.continuing_turn

For histories of a growing number of turns (each a reply with a tool call and a tool result of
``--tool-chars``), times one continuing turn of a named session two ways: matching it by
fingerprints of the whole history (what a request without a session id still does, and what every
turn did before) and by comparing its messages with the stored turn, hashing only the new one; plus
rendering and tokenizing its new messages. Prints a markdown table (microseconds, median of
``--repeat``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import click

from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.fingerprint import chain_fingerprint, fingerprints
from sidecar.conversation.store import SessionStore
from sidecar.engine.capacity import EngineCapacity
from sidecar.id_text import IdText
from sidecar.policy import build_policy
from sidecar.settings import SidecarSettings


def _history(turns: int, tool_chars: int) -> list[dict]:
    line = "src/app/module.py:120: in test_limits assert response.status == 200, body\n"
    tool = (line * (tool_chars // len(line) + 1))[:tool_chars]
    messages = [{"role": "system", "content": "You are a coding agent. " + line * 40}, {"role": "user", "content": "Fix the failing test."}]
    for k in range(turns):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": f"pytest -x -k t{k}"})}}
        messages += [{"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": tool}]
    return messages


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


@click.command()
@click.option("--turns", "turn_counts", default="2,10,50,200", show_default=True, help="History lengths, in turns.")
@click.option("--tool-chars", default=4000, show_default=True, help="Characters of each tool result (~1,000 tokens).")
@click.option("--repeat", default=31, show_default=True)
def main(turn_counts: str, tool_chars: int, repeat: int) -> None:
    from transformers import AutoTokenizer

    from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(build_qwen3_tokenizer(Path(tmp)))))
    print("| history (turns / characters) | match by fingerprints of the whole history | match by comparing, hash the new message "
          "| render + tokenize the new message |")
    print("|---|---|---|---|")
    for turns in map(int, turn_counts.split(",")):
        messages = _history(turns, tool_chars)
        previous, new = messages[:-1], messages[-1:]
        store = SessionStore(build_policy(SidecarSettings(), EngineCapacity(0)))
        res = store.resolve(previous[:-1], "agent")  # the stored turn: its prompt, then its reply
        state = res.next_state(previous[-1], IdText([1] * 10), 151645)
        store.record_turn(res.session, state)
        chars = sum(len(m["content"]) for m in messages)

        def by_fingerprints():
            assert store.resolve(messages, "agent", prints=fingerprints(messages)).base is state

        def by_comparing():
            base = store.known_turn(messages, "agent")
            assert base is state
            store.continue_turn(messages, "agent", "", base, chain_fingerprint(base.fingerprint, messages[base.n_messages :]))

        def render_new():
            renderer.render_suffix(new, 151645)

        print(f"| {turns} / {chars:,} | {_median_us(by_fingerprints, repeat):,.0f} us | {_median_us(by_comparing, repeat):,.0f} us "
              f"| {_median_us(render_new, repeat):,.0f} us |")


if __name__ == "__main__":
    main()

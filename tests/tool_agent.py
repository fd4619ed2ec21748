"""Helpers of the front-door tests: a scripted coding-agent model (it calls ``read_file`` until it
has seen ``calls`` tool results, then answers; it reads the engine's prompt, so any door works),
a model that says given texts, and the sidecar served in front of the SGLang double."""

from __future__ import annotations

from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder
from sidecar_thread import sidecar_in_thread

from sidecar.settings import load_settings

READ_FILE = {
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
ANSWER = "The bug is in f2.py."


def read_file_responder(tokenizer, calls: int = 3):
    def respond(input_ids, params):
        turn = tokenizer.decode(input_ids).count("<tool_response>")
        if turn < calls:
            text = f'Reading.\n<tool_call>\n{{"name": "read_file", "arguments": {{"path": "src/f{turn}.py"}}}}\n</tool_call>'
        else:
            text = ANSWER
        return tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID]

    return respond


def file_contents(path: str) -> str:
    return f"# contents of {path}\n" + "x = 1\n" * 50


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def says(tokenizer, *texts: str):
    """A model that answers each request with the next text, then its end token."""
    return scripted_responder(*[ids(tokenizer, t) + [IM_END_ID] for t in texts])


def serve_sidecar(double, tokenizer_dir, **server):
    """The sidecar in front of ``double`` in a background thread; a context manager yielding its URL."""
    settings = load_settings(overrides={"server": {"sglang_url": double.url, "tokenizer": str(tokenizer_dir), **server}})
    return sidecar_in_thread(settings)

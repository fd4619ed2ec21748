"""A scripted coding-agent model for the front-door tests: it calls ``read_file`` until it has
seen ``calls`` tool results, then answers. Works on any door (it reads the engine's prompt)."""

from __future__ import annotations

from sglang_double import IM_END_ID

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

"""The answers' shapes: SSE frames built from a pre-serialized template are byte for byte the plain
serialization of the whole chunk (compact UTF-8 JSON, as OpenAI streams it) and read back as the
chunk; tool calls and reply messages are shaped as OpenAI's."""

import json

from pydantic_core import to_json

from sidecar.generation.relay import GenerationResult
from sidecar.generation.tool_parsers import ToolCall
from sidecar.openai.shapes import ChunkFrames, chunk, reply_message, tool_call, usage_chunk, usage_dict


def _plain(payload):
    frame = b"data: " + to_json(payload) + b"\n\n"
    assert json.loads(frame[6:]) == payload  # what any client's JSON parser reads
    return frame


DELTAS = [
    {"role": "assistant", "content": ""},
    {"content": "héllo \"quoted\" \\ 🤖\n"},
    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": "ls"}'}}]},
    {},
]


def test_frames_equal_plain_serialization():
    for include_usage in (False, True):
        for model in ("qwen3", "模型/with \"quotes\"", "\x00delta\x00"):  # the last one takes the slow path
            frames = ChunkFrames("chatcmpl-1", model, 1700000000, include_usage)
            extra = {"usage": None} if include_usage else {}
            for delta in DELTAS:
                for finish in (None, "stop", "tool_calls", "length"):
                    assert frames.delta(delta, finish) == _plain(chunk("chatcmpl-1", model, 1700000000, delta, finish) | extra)
            usage = usage_dict(10, 3, 4)
            assert frames.usage(usage) == _plain(usage_chunk("chatcmpl-1", model, 1700000000, usage))


def test_tool_calls_and_the_reply_message_are_openai_shaped():
    tc = ToolCall("call_" + "0" * 24, "get_weather", '{"city": "Paris"}')
    assert tool_call(tc) == {"id": tc.id, "type": "function", "function": {"name": "get_weather", "arguments": tc.arguments}}
    with_call = GenerationResult(content="\nLet me check.\n", tool_calls=[tc])
    assert reply_message(with_call) == {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call(tc)]}
    assert reply_message(GenerationResult(content=" \n", tool_calls=[tc]))["content"] is None  # only whitespace around
    assert reply_message(GenerationResult(content=" plain answer ")) == {"role": "assistant", "content": " plain answer "}
    assert reply_message(GenerationResult()) == {"role": "assistant", "content": None}

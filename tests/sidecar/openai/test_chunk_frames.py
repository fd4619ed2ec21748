"""SSE frames built from a pre-serialized template are byte for byte the plain json.dumps frames."""

import json

from sidecar.openai.schema import ChunkFrames, chunk, usage_chunk, usage_dict


def _plain(payload):
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


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

"""A reply cut into content blocks: text runs and tool calls, each opened, filled and closed once,
in order, whatever the relay's events were."""

from __future__ import annotations

import pytest

from sidecar.frontdoor.blocks import BlockDelta, BlockStart, BlockStop, ReplyBlocks
from sidecar.generation.tool_parsers import ContentDelta, HermesToolParser, ToolCallArgumentsDelta, ToolCallStart


def _run(events):
    blocks = ReplyBlocks()
    out = [e for ev in events for e in blocks.feed(ev)] + blocks.finish()
    return blocks, [(type(e).__name__, e.block.index) for e in out]


def test_text_then_calls_then_text():
    blocks, trace = _run([
        ContentDelta("Let me "), ContentDelta("look."),
        ToolCallStart(0, "call_a", "read"), ToolCallArgumentsDelta(0, '{"p": 1}'),
        ToolCallStart(1, "call_b", "grep"), ToolCallArgumentsDelta(1, '{"q": 2}'),
        ContentDelta("Done."),
    ])
    assert trace == [
        ("BlockStart", 0), ("BlockDelta", 0), ("BlockDelta", 0), ("BlockStop", 0),
        ("BlockStart", 1), ("BlockDelta", 1), ("BlockStop", 1),
        ("BlockStart", 2), ("BlockDelta", 2), ("BlockStop", 2),
        ("BlockStart", 3), ("BlockDelta", 3), ("BlockStop", 3),
    ]
    assert [(b.call.name if b.call else None, b.text) for b in blocks.blocks] == [
        (None, "Let me look."), ("read", '{"p": 1}'), ("grep", '{"q": 2}'), (None, "Done."),
    ]


def test_an_empty_reply_has_no_blocks_and_finish_is_idempotent():
    blocks = ReplyBlocks()
    assert blocks.finish() == [] and blocks.blocks == []
    assert [type(e) for e in blocks.feed(ContentDelta("x"))] == [BlockStart, BlockDelta]
    assert [type(e) for e in blocks.finish()] == [BlockStop] and blocks.finish() == []


def test_arguments_for_a_call_that_is_not_open_are_a_bug():
    blocks = ReplyBlocks()
    blocks.feed(ContentDelta("x"))
    with pytest.raises(ValueError):
        blocks.feed(ToolCallArgumentsDelta(0, "{}"))


@pytest.mark.parametrize("split", [1, 3, 7, 1000])
def test_blocks_join_back_to_the_recorded_reply(split):
    """The texts of a reply's blocks join to exactly the content the turn records, however the
    parser's input was split: the echo of the blocks is recognised as the sidecar's reply."""
    text = 'Reading.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n\nThen:\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n</tool_call>'
    parser, blocks = HermesToolParser(), ReplyBlocks()
    events = [e for i in range(0, len(text), split) for e in parser.feed(text[i : i + split])] + parser.finish()
    for event in events:
        blocks.feed(event)
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert "".join(b.text for b in blocks.blocks if b.call is None) == content
    assert [b.call.name for b in blocks.blocks if b.call] == ["a", "b"]
    assert isinstance(blocks.finish()[0], BlockStop) and not any(isinstance(e, BlockDelta) for e in blocks.finish())

"""The relay: one result type folded from its events, and the one rule for aborting the engine
request (abort whenever SGLang may still be generating for a reply nobody reads)."""

import asyncio

import pytest

from sidecar.errors import engine_timeout, engine_unavailable
from sidecar.generation.relay import Generation
from sidecar.generation.tool_parsers import get_tool_parser


class Letters:
    """A tokenizer whose id i decodes to the letter chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i) for i in ids)


class Engine:
    """Streams cumulative chunks of ``ids``, then finishes (or fails with ``error``)."""

    def __init__(self, ids, finish=None, error=None):
        self.ids, self.finish, self.error = ids, finish, error
        self.aborted: list[str] = []

    async def generate_stream(self, payload):
        for n in range(1, len(self.ids) + 1):
            last = n == len(self.ids)
            yield {"output_ids": self.ids[:n], "meta_info": {"finish_reason": self.finish if last and not self.error else None}}
            await asyncio.sleep(0)
        if self.error is not None:
            raise self.error

    async def abort(self, rid):
        self.aborted.append(rid)


def generation(engine, stop=None, tools=False):
    parser = get_tool_parser("hermes" if tools else "none")
    return Generation(engine, {"rid": "r1", "input_ids": [1, 2]}, Letters(), parser, stop)


async def read_all(gen):
    return "".join([e.text async for e in gen.events()])


async def test_a_reply_the_engine_finished_is_not_aborted():
    engine = Engine([7, 4, 11, 11, 14], finish={"type": "stop", "matched": 99})
    gen = generation(engine)
    assert await read_all(gen) == "hello"
    gen.close()
    await asyncio.sleep(0)
    assert engine.aborted == [] and gen.finished
    assert gen.result.output_ids == [7, 4, 11, 11, 14, 99] and gen.result.end_id == 99  # the stop token is history


async def test_a_reader_that_stops_early_gets_the_engine_request_aborted():
    engine = Engine(list(range(20)), finish={"type": "length"})
    gen = generation(engine)
    async for _ in gen.events():
        break  # the agent went away after the first delta
    gen.close()
    gen.close()  # closing twice aborts once
    await asyncio.sleep(0)
    assert engine.aborted == ["r1"] and not gen.finished


async def test_an_engine_timeout_is_aborted_an_engine_failure_is_not():
    timed_out = Engine([0, 1], error=engine_timeout("too slow"))
    gen = generation(timed_out)
    with pytest.raises(Exception, match="too slow"):
        await read_all(gen)
    gen.close()
    await asyncio.sleep(0)
    assert timed_out.aborted == ["r1"]  # SGLang may still be generating

    dropped = Engine([0, 1], error=engine_unavailable("dropped"))
    gen = generation(dropped)
    with pytest.raises(Exception, match="dropped"):
        await read_all(gen)
    gen.close()
    await asyncio.sleep(0)
    assert dropped.aborted == []  # SGLang ended it itself


async def test_a_stop_string_ends_the_reply_and_aborts_at_once():
    engine = Engine([7, 4, 11, 11, 14, 22, 14, 17, 11, 3], finish={"type": "length"})  # "hellowor" ...
    gen = generation(engine, stop=["wor"])
    assert await read_all(gen) == "hello"
    assert engine.aborted == ["r1"] and gen.result.finish_reason == "stop"
    gen.close()
    await asyncio.sleep(0)
    assert engine.aborted == ["r1"]  # not twice


async def test_the_result_folds_tool_calls_as_they_stream():
    text = 'ok <tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    ids = [ord(c) - 97 for c in text]
    gen = generation(Engine(ids, finish={"type": "stop"}), tools=True)
    async for _ in gen.events():
        pass
    assert gen.result.content == "ok"
    assert [(c.name, c.arguments) for c in gen.result.tool_calls] == [("bash", '{"cmd": "ls"}')]
    assert gen.result.finish_reason == "tool_calls"


async def test_after_the_finish_the_stream_is_read_to_its_end_and_nothing_more_is_taken():
    """The relay reads SGLang's stream to its end after the finish (its [DONE]; a stream left
    unread loses its connection), and nothing after the finish changes the reply."""

    class Chatty(Engine):
        ended = False

        async def generate_stream(self, payload):
            async for chunk in super().generate_stream(payload):
                yield chunk
            yield {"output_ids": self.ids + [5, 5], "meta_info": {"finish_reason": None}}
            self.ended = True

    engine = Chatty([7, 4, 11, 11, 14], finish={"type": "stop", "matched": 99})
    gen = generation(engine)
    assert await read_all(gen) == "hello"
    assert engine.ended and gen.finished
    assert gen.result.output_ids == [7, 4, 11, 11, 14, 99]

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

    async def generate_batches(self, payload):  # a chunk a read
        for n in range(1, len(self.ids) + 1):
            last = n == len(self.ids)
            yield [{"output_ids": self.ids[:n], "meta_info": {"finish_reason": self.finish if last and not self.error else None}}]
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

        async def generate_batches(self, payload):
            async for batch in super().generate_batches(payload):
                yield batch
            yield [{"output_ids": self.ids + [5, 5], "meta_info": {"finish_reason": None}}]
            self.ended = True

    engine = Chatty([7, 4, 11, 11, 14], finish={"type": "stop", "matched": 99})
    gen = generation(engine)
    assert await read_all(gen) == "hello"
    assert engine.ended and gen.finished
    assert gen.result.output_ids == [7, 4, 11, 11, 14, 99]


class Batched(Engine):
    """Streams the same cumulative chunks, ``size`` of them a read (as a reader that fell behind
    takes them)."""

    def __init__(self, ids, size, finish=None):
        super().__init__(ids, finish)
        self.size = size

    async def generate_batches(self, payload):
        chunks = [c async for batch in super().generate_batches(payload) for c in batch]
        for i in range(0, len(chunks), self.size):
            yield chunks[i : i + self.size]


@pytest.mark.parametrize("size", [2, 3, 100])
async def test_chunks_read_together_are_one_batch_of_the_same_text_and_ids(size):
    text = 'ok then <tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    ids = [ord(c) - 97 for c in text]
    one, batched = generation(Engine(ids, finish={"type": "stop", "matched": 99}), tools=True), None
    events_one = [e async for e in one.events()]
    batched = generation(Batched(ids, size, finish={"type": "stop", "matched": 99}), tools=True)
    batches = [b async for b in batched.batches()]
    assert all(batches) and len(batches) < len(ids)  # a batch per read that brought text, none empty
    content = lambda events: "".join(e.text for e in events if hasattr(e, "text"))  # noqa: E731
    flat = [e for b in batches for e in b]
    assert content(flat) == content(events_one) == "ok then"
    assert batched.result.output_ids == one.result.output_ids == ids + [99]
    assert [(c.name, c.arguments) for c in batched.result.tool_calls] == [("bash", '{"cmd": "ls"}')]
    assert batched.result.finish_reason == "tool_calls" and batched.finished


async def test_a_stop_string_inside_a_batch_ends_the_reply_at_it():
    engine = Batched([7, 4, 11, 11, 14, 22, 14, 17, 11, 3], 4, finish={"type": "length"})  # "hellowor" ...
    gen = generation(engine, stop=["wor"])
    assert await read_all(gen) == "hello"
    assert engine.aborted == ["r1"] and gen.result.finish_reason == "stop"


async def test_a_batch_counts_its_tokens_once_for_the_inter_token_latency():
    heard = []
    gen = Generation(Batched(list(range(9)), 3, finish={"type": "length"}), {"rid": "r1", "input_ids": [1, 2]},
                     Letters(), get_tool_parser("none"), None, on_tokens=lambda interval, n: heard.append(n))
    await read_all(gen)
    assert heard == [3, 3]  # the first read's tokens start the clock; then a call per read of 3

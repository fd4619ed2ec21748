"""The worker seam: where a session lives, what a worker can hold, releasing a lease there."""

import asyncio

import pytest

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Worker, Workers


class Client:
    def __init__(self, up=True):
        self.up, self.closed = up, []

    async def healthy(self):
        return self.up

    async def close_session(self, session_id):
        self.closed.append(session_id)


def test_capacity_comes_from_server_info_and_unknown_is_zero():
    info = {"max_total_num_tokens": 173200, "max_req_input_len": 40960, "model_path": "x"}
    assert EngineCapacity.from_server_info(info) == EngineCapacity(173200, 40960)
    assert EngineCapacity.from_server_info({}) == EngineCapacity(0, 0)


async def test_a_new_session_is_placed_on_a_worker_and_its_lease_released_there():
    worker = Worker(Client(), EngineCapacity(1000))
    workers = Workers([worker])
    assert workers.place("agent-1") is worker and list(workers) == [worker]
    worker.release("agent-1")
    await asyncio.sleep(0)
    assert worker.client.closed == ["agent-1"]


async def test_healthy_only_when_every_worker_answers():
    assert await Workers([Worker(Client(), EngineCapacity(1))]).healthy()
    assert not await Workers([Worker(Client(), EngineCapacity(1)), Worker(Client(up=False), EngineCapacity(1))]).healthy()
    with pytest.raises(ValueError):
        Workers([])

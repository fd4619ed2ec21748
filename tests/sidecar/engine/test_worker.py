"""The worker seam: where a session lives, what a worker can hold, releasing a lease there."""

import asyncio

import pytest

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Worker, Workers


class Client:
    count = 0

    def __init__(self, up=True):
        self.up, self.closed = up, []
        Client.count += 1
        self.base_url = f"http://worker-{Client.count}"

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
    assert workers.get(worker.url) is worker and list(workers) == [worker]
    worker.release("agent-1")
    await asyncio.sleep(0)
    assert worker.client.closed == ["agent-1"]


async def test_healthy_only_when_every_worker_answers():
    assert await Workers([Worker(Client(), EngineCapacity(1))]).healthy()
    assert not await Workers([Worker(Client(), EngineCapacity(1)), Worker(Client(up=False), EngineCapacity(1))]).healthy()
    with pytest.raises(ValueError):
        Workers([])


async def test_a_worker_that_fails_its_health_is_down_and_a_lost_one_releases_nothing():
    up, down = Worker(Client(), EngineCapacity(1)), Worker(Client(up=False), EngineCapacity(1))
    workers = Workers([up, down])
    await workers.healthy()
    assert up.usable and not down.usable and workers.usable() == [up]
    down.release("agent-1")  # nothing is sent to a worker that is gone
    await asyncio.sleep(0)
    assert down.client.closed == []


def test_smg_listing_adds_joined_workers_removes_dropped_and_downs_unhealthy():
    from sidecar.engine.smg import SmgWorker

    a, b = Worker(Client(), EngineCapacity(1)), Worker(Client(), EngineCapacity(1))
    workers = Workers([a, b], factory=lambda url: Worker(type("C", (), {"base_url": url})(), EngineCapacity(0)))
    joined = workers.apply_listing([SmgWorker(a.url, False), SmgWorker("http://new:1", True)])
    assert [w.url for w in joined] == ["http://new:1"]
    assert not a.usable and b.removed and workers.get("http://new:1").usable


def test_target_worker_index_counts_only_smg_healthy_workers_in_its_order():
    from sidecar.engine.smg import SmgWorker, parse_workers, target_index

    listing = parse_workers({"workers": [{"url": "http://a/", "is_healthy": True}, {"url": "http://b", "is_healthy": False},
                                         {"url": "http://c", "is_healthy": True}]})
    assert target_index(listing, "http://a") == 0 and target_index(listing, "http://c") == 1
    assert target_index(listing, "http://b") is None
    with pytest.raises(ValueError):
        parse_workers({"nope": 1})


def test_a_lost_worker_says_its_sessions_move_only_when_another_worker_can_take_them(caplog):
    caplog.set_level("WARNING", logger="sidecar")
    alone = Worker(Client(), EngineCapacity(1000))
    Workers([alone])
    alone.mark_down("no answer")
    first, second = Worker(Client(), EngineCapacity(1000)), Worker(Client(), EngineCapacity(1000))
    Workers([first, second])
    first.mark_down("no answer")
    second.mark_down("no answer")  # the last one: nowhere to move to
    lines = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert ["move to another worker" in line for line in lines] == [False, True, False]
    assert "fail until it answers again" in lines[0]

"""Placement across workers: the roomiest worker that fits; none when none fits (the gate waits)."""

from sidecar.policy.placement import WorkerRoom, choose_worker


def test_a_new_session_goes_to_the_worker_with_the_most_free_tokens():
    rooms = [WorkerRoom("a", 1000, 700, 3), WorkerRoom("b", 1000, 200, 1), WorkerRoom("c", 2000, 1500, 2)]
    assert choose_worker(rooms, 100) == "b"


def test_no_worker_has_room_means_wait_unless_forced():
    rooms = [WorkerRoom("a", 1000, 950, 3), WorkerRoom("b", 1000, 900, 1)]
    assert choose_worker(rooms, 200) is None
    assert choose_worker(rooms, 200, force=True) == "b"


def test_an_empty_worker_always_fits_and_unknown_capacity_is_used_only_when_none_is_known():
    assert choose_worker([WorkerRoom("a", 100, 0, 0)], 5000) == "a"
    assert choose_worker([WorkerRoom("x", 0, 0, 0), WorkerRoom("a", 1000, 100, 1)], 10) == "a"
    assert choose_worker([], 10, force=True) is None

"""A turn's policy calls, in order, and the after-turn lease sent only when it moved; the simulator's
in-process sidecar makes the very same calls (one sequence, so simulated figures are the product's)."""

from __future__ import annotations

from sidecar_tools.simulator.virtual_replay import SidecarLoop

from sidecar.engine.lease import LeaseRequest
from sidecar.settings import load_settings
from sidecar.turn.policy_calls import turn_finished, turn_started


class Recorder:
    """A policy that records the calls made of it and answers the leases it is given."""

    def __init__(self, inner=None, sent=LeaseRequest(60.0, 10.0, 2.0), revised=LeaseRequest(60.0, 10.0, 2.0)):
        self.calls: list[str] = []
        self._inner, self._sent, self._revised = inner, sent, revised

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append(name)
            if self._inner is not None:
                return getattr(self._inner, name)(*args, **kwargs)
            return {"lease_request": self._sent, "after_turn": self._revised}.get(name)

        return call


def test_a_turn_asks_its_lease_after_counting_the_request():
    policy = Recorder()
    assert turn_started(policy, "s", 100, 1.0) == LeaseRequest(60.0, 10.0, 2.0)
    assert policy.calls == ["on_request", "lease_request"]


def test_the_revised_lease_goes_out_only_when_it_moved():
    sent = []
    unmoved = Recorder()
    turn_finished(unmoved, "s", 150, [], LeaseRequest(60.0, 10.0, 2.0), 2.0, sent.append)
    assert unmoved.calls == ["on_turn_end", "after_turn"] and sent == []

    moved = Recorder(revised=LeaseRequest(200.0, 90.0, 5.0))
    turn_finished(moved, "s", 150, ["bash"], LeaseRequest(60.0, 10.0, 2.0), 2.0, sent.append)
    assert moved.calls == ["on_turn_end", "after_turn", "lease_revised"] and sent == [LeaseRequest(200.0, 90.0, 5.0)]

    no_plugin = Recorder(revised=LeaseRequest(200.0, 90.0, 5.0))
    turn_finished(no_plugin, "s", 150, ["bash"], LeaseRequest(60.0, 10.0, 2.0), 2.0, None)
    assert no_plugin.calls == ["on_turn_end", "after_turn"]  # a worker without the plugin hears nothing


def test_the_simulators_sidecar_makes_the_turns_calls():
    settings = load_settings(None, {"policy": {"mode": "predictive"}, "admission": {"enabled": False}})
    now = [0.0]
    loop = SidecarLoop(settings, 100_000, lambda: now[0])
    loop.policy = recorder = Recorder(inner=loop.policy)
    loop.revise = lambda sid, args: None
    assert loop.admit("s", list(range(100)), True, proceed=lambda: None)
    loop.start_turn("s", 100)
    now[0] = 1.0
    loop.end_turn("s", 150, ["bash"], ok=True)
    calls = recorder.calls
    revised = calls[5:-1] == ["lease_revised"]  # whether the prediction moved is the policy's; the order is not
    assert calls == ["offer_admission", "on_request", "lease_request", "on_turn_end", "after_turn",
                     *(["lease_revised"] if revised else []), "release_admission"]

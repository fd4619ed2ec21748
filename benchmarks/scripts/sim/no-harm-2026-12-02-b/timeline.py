"""Engine timeline of one simulated run: where the time goes (issue 24, point 3).

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-b/timeline.py OUT.tsv -- <simulate flags>

Runs ``sglang-sidecar simulate`` in process with the given flags and samples the first worker after
its steps, at most once per virtual second: running / queued requests in SGLang, KV held by
requests and leases (not evictable), resident KV, host-tier tokens, sessions waiting at the
sidecar's door, and the engine's prefill / decode seconds so far. Writes a TSV, one row a second.
"""

from __future__ import annotations

import sys

from sidecar_tools.simulator import workers as workers_mod

ROWS: list[tuple] = []
GATE: list = []  # the replay's admission gate, once a sidecar exists
_next = [0.0]


def _sample(self) -> None:
    _orig(self)
    e = self.engine
    if e.now < _next[0]:
        return
    _next[0] = int(e.now) + 1.0
    avail = e.alloc.available_size()
    resident = e.kv_tokens - avail
    used = resident - e.cache.evictable_size()
    host = 0
    if e.copies is not None:
        pool = e.cache.cache_controller.mem_pool_host
        host = pool.logical_size - pool.available_size()
    door = GATE[0].queue_length if GATE else 0
    ROWS.append((round(e.now, 1), len(e.running), len(e.waiting), used, resident, host, door,
                 round(e.busy_s["prefill"], 2), round(e.busy_s["decode"], 2)))


_orig = workers_mod.SimWorker.sample
workers_mod.SimWorker.sample = _sample


def main() -> None:
    out, sep, *flags = sys.argv[1:]
    assert sep == "--", __doc__
    from sidecar_tools.simulator import virtual_replay

    init = virtual_replay.SidecarLoop.__init__

    def patched(self, *a, **k):
        init(self, *a, **k)
        GATE.append(self.policy.gate)

    virtual_replay.SidecarLoop.__init__ = patched
    from sidecar_tools.simulator.cli import simulate

    try:
        simulate.main(flags, standalone_mode=False)
    finally:
        with open(out, "w") as f:
            f.write("t\trunning\tqueued\tused_kv\tresident_kv\thost_kv\tdoor\tprefill_s\tdecode_s\n")
            for r in ROWS:
                f.write("\t".join(map(str, r)) + "\n")


if __name__ == "__main__":
    main()

"""Per-request engine timeline of one simulated run: where a turn's TTFT goes (issue 24).

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-c/req_timeline.py OUT.tsv -- <simulate flags>

Runs ``sglang-sidecar simulate`` in process and records, for every request of the first worker:
arrival, the refused prefill passes it waited through while at the head of the queue (NO_TOKEN:
what the pool held then: free, evictable, hard-leased tokens, running requests), the passes in
which other requests were prefilled ahead of it, and its own prefill (start, length, tokens
computed, tokens loaded from host, whether it jumped the queue). One row a request.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from sidecar_tools.simulator.engine import SimEngine

ARR: dict[str, dict] = {}
REFUSED: dict[str, list] = defaultdict(list)  # rid -> [(t, free, evictable, hard, running)]
AHEAD: dict[str, list] = defaultdict(list)  # rid -> [(t, dt, batch rids)]
DECODE_WHILE_WAITING: dict[str, float] = defaultdict(float)
PASSES: list = []  # every refused pass: (t, free, evictable, hard, running, head, queued)

_submit, _prefill, _get, _decode = SimEngine.submit, SimEngine._run_prefill, SimEngine._get_new_batch_prefill, SimEngine._run_decode


def _hard(e) -> int:
    if e.mgr is None:
        return 0
    try:
        return int(e.mgr.hard_tokens())
    except Exception:
        return e.mgr.table.count("hard")


def submit(self, sim):
    _submit(self, sim)
    ARR[sim.rid] = dict(rid=sim.rid, session=sim.session_id, arrival=self.now, prompt=len(sim.input_ids),
                        order=len(ARR))


def get(self):
    waiting = [r.rid for r in self.waiting]
    batch = _get(self)
    if batch is None and waiting:
        head = self.waiting[0].rid if self.waiting else waiting[0]
        row = (round(self.now, 3), self.alloc.available_size(), self.cache.evictable_size(), _hard(self),
               len(self.running))
        REFUSED[head].append(row)
        PASSES.append((*row, head, len(waiting)))
    elif batch is not None:
        chosen = [r.rid for r in batch.reqs]
        self._last_batch_waiting = [w for w in waiting if w not in chosen]
    return batch


def run_prefill(self, batch):
    t0 = self.now
    _prefill(self, batch)
    dt = self.now - t0
    rids = [r.rid for r in batch.reqs]
    for r, (n, prefix) in zip(batch.reqs, batch.chunks):
        a = ARR.get(r.rid)
        if a is not None and "start" not in a:
            a.update(start=round(t0, 4), prefill_s=round(dt, 4), computed=n, prefix=prefix,
                     host=int(getattr(r, "cached_tokens_host", 0) or 0), batch=len(rids),
                     load=int(batch.hicache_consumer_index >= 0))
    for w in getattr(self, "_last_batch_waiting", []):
        AHEAD[w].append((round(t0, 3), round(dt, 4), len(rids)))


def run_decode(self, horizon):
    t0 = self.now
    _decode(self, horizon)
    for r in self.waiting:
        DECODE_WHILE_WAITING[r.rid] += self.now - t0


SimEngine.submit, SimEngine._get_new_batch_prefill, SimEngine._run_prefill, SimEngine._run_decode = \
    submit, get, run_prefill, run_decode


def main() -> None:
    out, sep, *flags = sys.argv[1:]
    assert sep == "--", __doc__
    from sidecar_tools.simulator.cli import simulate

    try:
        simulate.main(flags, standalone_mode=False)
    finally:
        cols = ["rid", "session", "arrival", "prompt", "start", "wait_s", "prefill_s", "computed", "prefix", "host",
                "load", "batch", "refused", "refused_s", "ahead", "ahead_s", "decode_s", "refused_first"]
        with open(out, "w") as f:
            f.write("\t".join(cols) + "\n")
            for rid, a in ARR.items():
                ref = REFUSED.get(rid, [])
                ah = AHEAD.get(rid, [])
                a = dict(a, wait_s=round(a.get("start", a["arrival"]) - a["arrival"], 4),
                         refused=len(ref), refused_s=round(ref[-1][0] - ref[0][0], 3) if ref else 0,
                         ahead=len(ah), ahead_s=round(sum(x[1] for x in ah), 4),
                         decode_s=round(DECODE_WHILE_WAITING.get(rid, 0.0), 4),
                         refused_first="|".join(map(str, ref[0])) if ref else "")
                f.write("\t".join(str(a.get(c, "")) for c in cols) + "\n")
        with open(out.replace(".tsv", "") + "-refused.tsv", "w") as f:
            f.write("t\tfree\tevictable\thard\trunning\thead\tqueued\n")
            for row in PASSES:
                f.write("\t".join(map(str, row)) + "\n")


if __name__ == "__main__":
    main()

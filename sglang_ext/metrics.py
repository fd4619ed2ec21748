"""Lease metrics: in-process counters, mirrored to SGLang's ``/metrics``.

SGLang serves ``/metrics`` from the Prometheus *multiprocess* registry
(``PROMETHEUS_MULTIPROC_DIR``, set by the main process before it spawns the
scheduler). Its own scheduler metrics are plain ``prometheus_client`` objects
created in the scheduler process after that variable is set, gauges with
``multiprocess_mode="mostrecent"``, labelled like the scheduler's collector
(model_name, tp_rank, ...). We do the same, so our series appear next to
SGLang's. ``prometheus_client`` is imported only in ``attach_prometheus``:
importing it before the variable is set would break SGLang's own metrics.
No sglang import here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

# key -> (kind, prometheus name, help, extra label names)
METRIC_SPECS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "leased_tokens": (
        "gauge",
        "sglang_ext:session_leased_tokens",
        (
            "KV tokens held by hard session leases (union of their paths): locked, "
            "so neither evictable nor counted as free by admission."
        ),
        (),
    ),
    "lease_limit_tokens": (
        "gauge",
        "sglang_ext:session_lease_limit_tokens",
        "Upper bound on hard-leased tokens (max_leased_fraction x KV pool).",
        (),
    ),
    "leases": (
        "gauge",
        "sglang_ext:session_leases",
        "Live session leases by tier (hard = locked, soft = evicted after unleased KV).",
        ("tier",),
    ),
    "grants": (
        "counter",
        "sglang_ext:session_lease_grants_total",
        "Leases granted or renewed when a request of a session finished.",
        (),
    ),
    "expirations": (
        "counter",
        "sglang_ext:session_lease_expirations_total",
        "Leases whose TTL ran out (their KV went back to LRU order).",
        ("tier",),
    ),
    "pressure_releases": (
        "counter",
        "sglang_ext:session_lease_pressure_releases_total",
        (
            "Hard leases released early because queued prefills could not be admitted "
            "(stage=prefill), a chunked prefill's next chunk would not fit (stage=chunk) or running "
            "decodes would otherwise be retracted (stage=decode)."
        ),
        ("stage",),
    ),
    "yields": (
        "counter",
        "sglang_ext:session_lease_yields_total",
        (
            "Host tier: hard leases unlocked (kept soft) because a queued request did not fit "
            "(stage=prefill), a chunk would not fit (stage=chunk) or the next decode step would not "
            "(stage=decode), and all of their KV was backed up on host (a reload, not a recompute)."
        ),
        ("stage",),
    ),
    "blocked_passes": (
        "counter",
        "sglang_ext:blocked_prefill_passes_total",
        (
            "Host tier: prefill passes whose head request was refused for KV, by what the plugin "
            "could do: yielded (backed-up hard leases unlocked), in_use (every backed-up hard lease's "
            "KV is also locked by requests: unlocking frees nothing), unbacked (the rest has no host "
            "copy), no_hard_leases (leases hold nothing; the room is the running batch's), "
            "fits (free + evictable KV would hold it by the plugin's estimate and no backed-up hard lease could yield)."
        ),
        ("outcome",),
    ),
    "demotions": (
        "counter",
        "sglang_ext:session_lease_demotions_total",
        "Hard leases turned soft to keep hard-leased tokens under the bound.",
        (),
    ),
    "releases": (
        "counter",
        "sglang_ext:session_lease_releases_total",
        (
            "Leases ended by the session (reason=ended: a request without TTL; closed: "
            "/close_session), dropped with the tree (reason=flush) or with their host copy "
            "(reason=host_evicted)."
        ),
        ("reason",),
    ),
    "leased_evicted_tokens": (
        "counter",
        "sglang_ext:session_leased_evicted_tokens_total",
        (
            "KV tokens evicted while a lease still pointed at them (soft leases only; "
            "hard leases are locked and must stay at 0)."
        ),
        ("tier",),
    ),
    # ---- host tier (HiCache)
    "leased_demoted_tokens": (
        "counter",
        "sglang_ext:session_leased_demoted_tokens_total",
        (
            "KV tokens of a live lease's tail node moved from GPU to host (the lease stays; the "
            "KV is reloadable)."
        ),
        ("tier",),
    ),
    "tier_changes": (
        "counter",
        "sglang_ext:session_lease_tier_changes_total",
        (
            "Leases moved by the host-tier rule: to=soft (KV backed up on host and not due, "
            "unlocked), to=hard (locked: KV without host copy, or its session is due)."
        ),
        ("to",),
    ),
    "prefetches": (
        "counter",
        "sglang_ext:session_prefetches_total",
        (
            "Host-to-GPU loads of a session's KV ahead of its expected return: issued, then used "
            "(its next request found the KV on the GPU) or wasted (the KV left the GPU, or the "
            "lease ended, before that)."
        ),
        ("outcome",),
    ),
    "prefetched_tokens": (
        "counter",
        "sglang_ext:session_prefetched_tokens_total",
        "KV tokens loaded from host by prefetches.",
        (),
    ),
    "prefetch_skips": (
        "counter",
        "sglang_ext:session_prefetch_skips_total",
        (
            "Due prefetches held back (once per session and reason while due): reason=room "
            "(only KV more valuable than it could make room), slots (another host-to-GPU load "
            "pending), bound (hard-lease bound), declined (SGLang's load_back refused it)."
        ),
        ("reason",),
    ),
    "critical_load_back_tokens": (
        "counter",
        "sglang_ext:critical_load_back_tokens_total",
        "KV tokens loaded from host at admission, on a request's critical path (not prefetched).",
        (),
    ),
    "returning_turns": (
        "counter",
        "sglang_ext:session_returning_turns_total",
        (
            "First admission of a leased session's next request, by where its leased KV was: "
            "kv=gpu (already on the GPU), host (loaded back at admission), missed (recomputed)."
        ),
        ("kv",),
    ),
    "after_turn_updates": (
        "counter",
        "sglang_ext:session_after_turn_updates_total",
        (
            "After-turn lease updates through /set_internal_state: result=applied, or no_lease "
            "(the session held no lease)."
        ),
        ("result",),
    ),
}

# prometheus_client refuses to register a name twice per process, so the metric
# families are created once and shared by every LeaseMetrics in the process.
_FAMILIES: dict[str, Any] = {}
_FAMILY_LABELS: tuple[str, ...] | None = None


def _families(base_label_names: tuple[str, ...]) -> dict[str, Any] | None:
    global _FAMILY_LABELS
    if _FAMILIES:
        return _FAMILIES if base_label_names == _FAMILY_LABELS else None
    from prometheus_client import Counter, Gauge

    for key, (kind, name, doc, extra) in METRIC_SPECS.items():
        labelnames = base_label_names + extra
        if kind == "gauge":
            _FAMILIES[key] = Gauge(
                name, doc, labelnames, multiprocess_mode="mostrecent"
            )
        else:
            _FAMILIES[key] = Counter(name, doc, labelnames)
    _FAMILY_LABELS = base_label_names
    return _FAMILIES


class LeaseMetrics:
    """Counters and gauges of one lease manager; readable without Prometheus."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._prom: dict[str, Any] | None = None
        self._base_labels: dict[str, str] = {}

    def attach_prometheus(self, base_labels: Mapping[str, Any]) -> bool:
        """Mirror everything to Prometheus from now on (values so far included)."""
        if self._prom is not None:
            return True
        labels = {str(k): str(v) for k, v in base_labels.items()}
        try:
            families = _families(tuple(labels))
        except Exception:  # never let metrics break serving
            logger.exception("sglang_ext: could not create Prometheus metrics")
            return False
        if families is None:
            logger.warning(
                "sglang_ext: Prometheus metrics already bound to other labels"
            )
            return False
        self._prom, self._base_labels = families, labels
        for (key, extra), value in self._values.items():
            self._push(key, dict(extra), value)
        return True

    @property
    def exported(self) -> bool:
        return self._prom is not None

    def inc(self, key: str, amount: float = 1, **labels: str) -> None:
        if amount <= 0:
            return
        k = (key, tuple(sorted(labels.items())))
        self._values[k] = self._values.get(k, 0) + amount
        self._push(key, labels, amount)

    def set(self, key: str, value: float, **labels: str) -> None:
        self._values[(key, tuple(sorted(labels.items())))] = value
        self._push(key, labels, value)

    def get(self, key: str, **labels: str) -> float:
        return self._values.get((key, tuple(sorted(labels.items()))), 0)

    def total(self, key: str) -> float:
        """Sum over all label values of one metric."""
        return sum(v for (k, _), v in self._values.items() if k == key)

    def series(self) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        """Every series as (key, its labels as sorted (name, value) pairs, value), sorted: what
        ``snapshot`` and an exporter of another format (the simulator's /metrics) read."""
        return [(key, extra, value) for (key, extra), value in sorted(self._values.items())]

    def snapshot(self) -> dict[str, Any]:
        return {key + "".join(f"[{v}]" for _, v in extra): value for key, extra, value in self.series()}

    def _push(self, key: str, labels: Mapping[str, str], value: float) -> None:
        """Gauges take the value, counters the increment (the total on attach)."""
        if self._prom is None:
            return
        try:
            child = self._prom[key].labels(**self._base_labels, **labels)
            if METRIC_SPECS[key][0] == "gauge":
                child.set(value)
            else:
                child.inc(value)
        except Exception:
            logger.exception("sglang_ext: failed to update metric %s", key)

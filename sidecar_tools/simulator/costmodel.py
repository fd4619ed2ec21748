"""Step-time model of one SGLang forward step, and the calibration file that holds its numbers.

SGLang runs either a prefill (extend) batch or a decode batch per scheduler iteration, never both
(``--enable-mixed-chunk`` is off by default). The model:

    prefill step = a + b * sum(n_i) + e * sum(n_i * p_i + n_i * (n_i + 1) / 2)
    decode step  = a + c * B        + d * sum(context_j)

``n_i`` new tokens of request i on top of ``p_i`` already computed (cached or earlier chunks);
``B`` requests in the decode batch, ``context_j`` their KV lengths. ``a`` is the per-step overhead
(launch, sampling, scheduler), ``b`` the linear layers per prefilled token, ``e`` causal attention
per (query, key) pair in prefill (compute bound), ``c`` per-sequence decode cost, ``d`` the
memory-bound KV read per context token in decode. ``e`` is tied to ``b`` by the model's FLOP
ratio (``prefill_pair_ratio``; attention FLOPs per pair / linear FLOPs per token), so four
numbers are fitted: a, b, c, d (``simulate calibrate``).

The host tier (HiCache) adds the two copy streams and where a load sits in a prefill step:

    copy on a stream = latency per submission + tokens / rate     (queued behind earlier copies)
    prefill step with a load = max(C, s + (f - s) / L + C, f + C / L)

``C`` is the step above; the load's copy runs from ``s`` to ``f`` (relative to the step's start;
``s`` < 0 for a prefetch already under way). SGLang starts a load-back when it builds the prefill
batch (``ready_to_load_host_cache``), behind the forward already on the GPU (its load fence), and
the forward waits per layer on the load's events (``memory_pool`` -> ``LayerDoneCounter``): layer
``i`` computes once layer ``i``'s KV has landed, so with ``L`` layers of equal size the step ends
after the first layer's copy plus all compute, or after the last layer's copy plus one layer's
compute, whichever is later - roughly max(compute, load) plus a layer. A decode step never waits
(its batch has no consumer index). Host-to-device and device-to-host copies use separate streams
and copy engines (full-duplex PCIe), so write-through backup traffic slows neither loads nor
forwards here; it matters through SGLang's own bookkeeping: KV whose backup is in flight stays
locked (not evictable) until its copy lands, and ``write_back`` blocks eviction until it does.
Only the host-to-device rate and latency are fitted (``simulate calibrate --fit ...``); the
write side defaults to the same PCIe rate.

No sglang import here.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"
DEFAULT_CALIBRATION = CALIBRATION_DIR / "h200-qwen3-8b.json"

# Qwen3-8B: 36 layers; KV per token 36 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes (bf16).
QWEN3_8B_LAYERS = 36
QWEN3_8B_KV_BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2
# Qwen3-8B: attention 4 * (32 heads * 128) * 36 layers FLOPs per (query, key) pair; linear layers
# 2 * 6.95e9 non-embedding parameters FLOPs per token.
QWEN3_8B_PAIR_RATIO = 4 * 32 * 128 * 36 / (2 * 6.95e9)


@dataclass(frozen=True)
class CostModel:
    step_s: float = 0.006  # a
    prefill_token_s: float = 3.0e-5  # b
    decode_seq_s: float = 1.0e-4  # c
    decode_ctx_token_s: float = 3.5e-8  # d
    prefill_pair_ratio: float = QWEN3_8B_PAIR_RATIO  # e = b * ratio
    # host tier (HiCache): copy streams and the forward's layer pipeline
    host_load_tokens_per_s: float = 200_000.0  # host-to-GPU KV tokens per second (one stream)
    host_load_latency_s: float = 0.001  # per load submission (per-layer launches, index prep)
    host_write_tokens_per_s: float = 200_000.0  # GPU-to-host (write-through backup)
    host_write_latency_s: float = 0.001
    model_layers: float = QWEN3_8B_LAYERS  # L: layers a load is pipelined over
    kv_bytes_per_token: float = QWEN3_8B_KV_BYTES_PER_TOKEN  # --hicache-size GB -> host tokens

    FITTED = ("step_s", "prefill_token_s", "decode_seq_s", "decode_ctx_token_s")
    HOST_FITTED = ("host_load_tokens_per_s", "host_load_latency_s", "host_write_tokens_per_s",
                   "host_write_latency_s")

    @property
    def prefill_pair_s(self) -> float:
        return self.prefill_token_s * self.prefill_pair_ratio

    # ------------------------------------------------------------------ steps
    def prefill_time(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill step over ``(new_tokens, prefix_tokens)`` per request."""
        tokens = sum(n for n, _ in chunks)
        pairs = sum(n * p + n * (n + 1) / 2 for n, p in chunks)
        return self.step_s + self.prefill_token_s * tokens + self.prefill_pair_s * pairs

    def prefill_time_with_load(self, compute_s: float, load_from_s: float, load_done_s: float) -> float:
        """A prefill step of ``compute_s`` whose forward waits per layer on a load copied from
        ``load_from_s`` to ``load_done_s`` (seconds from the step's start; see the module doc)."""
        layers = max(self.model_layers, 1.0)
        first_layer_lands = load_from_s + (load_done_s - load_from_s) / layers
        return max(compute_s, first_layer_lands + compute_s, load_done_s + compute_s / layers)

    def decode_time(self, batch: int, context_sum: int) -> float:
        return self.step_s + self.decode_seq_s * batch + self.decode_ctx_token_s * context_sum

    def decode_jump_time(self, batch: int, context_sum: int, steps: int) -> float:
        """``steps`` decode steps in a row; every step each sequence's context grows by one."""
        if steps <= 0:
            return 0.0
        first = self.decode_time(batch, context_sum)
        return steps * first + self.decode_ctx_token_s * batch * steps * (steps - 1) / 2

    def decode_steps_to_reach(self, batch: int, context_sum: int, dt: float) -> int:
        """Fewest decode steps (>= 1) whose total time is at least ``dt`` (free steps never get there)."""
        if dt <= 0:
            return 1
        t0 = self.decode_time(batch, context_sum)
        g = self.decode_ctx_token_s * batch
        if t0 <= 0 and g <= 0:
            return sys.maxsize
        if g <= 0:
            k = math.ceil(dt / t0)
        else:  # g/2 k^2 + (t0 - g/2) k - dt = 0
            half = g / 2
            k = math.ceil((-(t0 - half) + math.sqrt((t0 - half) ** 2 + 4 * half * dt)) / (2 * half))
        k = max(1, k)
        while k > 1 and self.decode_jump_time(batch, context_sum, k - 1) >= dt:
            k -= 1
        while self.decode_jump_time(batch, context_sum, k) < dt:
            k += 1
        return k

    def recompute_s_per_token(self, context_tokens: int = 0) -> float:
        """Seconds per token to prefill a whole context of this size (sidecar policy units)."""
        n = max(context_tokens, 1)
        return self.prefill_time([(n, 0)]) / n

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"cost model: unknown coefficient(s) {unknown}; known: {sorted(names)}")
        return cls(**{k: float(v) for k, v in data.items()})

    @classmethod
    def paced(cls, step_s: float) -> CostModel:
        """Every step, prefill or decode, takes ``step_s`` whatever its size (0 = no time at all):
        a stand-in that streams one token per step at a chosen pace."""
        return cls(step_s=step_s, prefill_token_s=0.0, decode_seq_s=0.0, decode_ctx_token_s=0.0)

    def replace(self, **changes: float) -> CostModel:
        return CostModel(**{**self.to_dict(), **changes})

    def describe(self) -> str:
        return (f"a={self.step_s * 1e3:.3f} ms/step, b={self.prefill_token_s * 1e6:.2f} us/prefill token, "
                f"c={self.decode_seq_s * 1e6:.1f} us/decode seq, d={self.decode_ctx_token_s * 1e9:.2f} ns/context token, "
                f"e={self.prefill_pair_s * 1e12:.3f} ps/prefill pair")

    def describe_host(self) -> str:
        return (f"host->GPU {self.host_load_tokens_per_s / 1e3:.0f}K tokens/s + {self.host_load_latency_s * 1e3:.2f} ms, "
                f"GPU->host {self.host_write_tokens_per_s / 1e3:.0f}K tokens/s + {self.host_write_latency_s * 1e3:.2f} ms, "
                f"{self.model_layers:g} layers")


def load_calibration(path: str | Path | None = None) -> tuple[CostModel, dict[str, Any]]:
    """(cost model, whole calibration document). Default: the committed H200 calibration."""
    path = Path(path) if path else DEFAULT_CALIBRATION
    if not path.exists():
        hint = (" (a wheel install needs the package data simulator/calibration/*.json; or pass --calibration)"
                if path == DEFAULT_CALIBRATION else "")
        raise FileNotFoundError(f"calibration file {path} not found{hint}")
    doc = json.loads(path.read_text())
    return CostModel.from_dict(doc["model"]), doc


def save_calibration(path: str | Path, model: CostModel, **meta: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": "sim-calibration-v1", **meta, "model": model.to_dict()}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path

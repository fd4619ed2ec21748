"""SGLang 0.5.23's HiCache host tier on a CPU: the real code, its CUDA seams replaced.

``attach_host_tier(cache, host_tokens=...)`` calls the cache's own
``UnifiedRadixCache.init_hicache`` (the same call ``create_unified_radix_cache`` makes for
``--enable-hierarchical-cache``), so the real ``HybridCacheController``, host pool
(``MHATokenToKVPoolHost``), tree bookkeeping, write-through backup, GPU-leaf demotion,
host-leaf eviction, ``load_back`` / ``init_load_back`` / ``ready_to_load_host_cache`` /
``loading_check`` all run. The KV really moves between the two pools.

What needs CUDA, and what replaces it (nothing else is touched):

* **Pinned host memory.** The host pool allocates through
  ``pool_host.common.ALLOC_MEMORY_FUNCS[device type]``, whose default registers the buffer with
  ``cudaHostRegister``. SGLang already keys that table by device (npu, musa, xpu); we add the
  ``"cpu"`` entry: a plain ``torch.empty``.
* **The transfer kernel.** With ``--hicache-io-backend direct`` and the ``layer_first`` layout the
  host pool calls one ``sgl_kernel.kvcacheio`` op, ``transfer_kv_direct``, imported into
  ``pool_host.mha`` only on CUDA/ROCm. We bind that name to a torch index copy (same contract:
  per layer, ``dst[dst_indices] = src[src_indices]``).
* **Streams and events.** ``cache_controller`` and ``l2_transfer`` reach streams and events through
  their module-level ``device_module``; we bind it to ``VIRTUAL_DEVICE``, whose streams and events
  behave like ``torch.cpu``'s (synchronous: an event is done once recorded) unless a stream
  belongs to a ``CopyEngine``. ``attach_host_tier(..., copies=CopyEngine(...))`` gives the
  controller's host-to-device and device-to-host streams to one: each copy then takes virtual
  time on its stream (a fixed latency per submission + tokens / bandwidth, queued behind the
  stream's earlier copies), and an event recorded after it is done only once the simulation's
  clock passes that time - so SGLang's own ``writing_check`` / ``loading_check`` see backups and
  loads land when they would on the GPU, and a blocking ``synchronize`` on a pending event is a
  stall of the host thread (``CopyEngine.take_stall``). For tests that need a transfer *in
  flight* with no clock, ``TRANSFERS.hold()`` swaps in events that stay pending until
  ``TRANSFERS.release()`` (the copy itself is still done at submission; only its completion
  signal waits). Must be entered before ``attach_host_tier`` for the per-layer load events.

What cannot run here: the forward itself, which on the GPU waits per layer on the load events
(``memory_pool``); ``engine.SimEngine`` times that from the load's virtual events. Importing this
module does not import sglang.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

HICACHE_ARGS = {
    "enable_hierarchical_cache": True,
    "hicache_io_backend": "direct",  # the one backend whose kernel has a torch equivalent
    "hicache_mem_layout": "layer_first",
}
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

_installed = False


@dataclass(frozen=True)
class HostTierArgs:
    """SGLang's host-tier flags as the simulator takes them (``--enable-hierarchical-cache``).

    ``ratio`` is ``--hicache-ratio`` (SGLang resolves an unset ratio to 2.0), ``size_gb``
    ``--hicache-size`` (GB of host KV, overrides the ratio), ``size_tokens`` the simulator's own
    way to give the host pool in tokens (overrides both), ``write_policy``
    ``--hicache-write-policy``."""

    ratio: float | None = None
    size_gb: float = 0.0
    size_tokens: int | None = None
    write_policy: str = "write_through"

    DEFAULT_RATIO = 2.0  # hicache_hook.handle_hicache_ratio_default (cache mode)

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"--hicache-write-policy must be one of {WRITE_POLICIES}, got {self.write_policy!r}")
        if self.ratio is not None and not self.ratio > 0:
            raise ValueError(f"--hicache-ratio must be positive, got {self.ratio}")
        if self.size_gb < 0 or (self.size_tokens is not None and self.size_tokens <= 0):
            raise ValueError("--hicache-size / --hicache-size-tokens must be positive")

    def host_tokens(self, device_tokens: int, kv_bytes_per_token: float) -> int:
        """The host pool SGLang allocates (before its padding page): ``HostKVCache.__init__``."""
        if self.size_tokens:
            return int(self.size_tokens)
        if self.size_gb > 0:
            return int(self.size_gb * 1e9 // kv_bytes_per_token)
        return int(device_tokens * (self.ratio if self.ratio is not None else self.DEFAULT_RATIO))


def _alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    """``ALLOC_MEMORY_FUNCS`` entry for a CPU-only process: nothing to pin or register."""
    import torch

    return torch.empty(dims, dtype=dtype, device=device)


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """torch stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` (token indices given in full);
    the copy takes virtual time on the current stream when that stream belongs to a CopyEngine."""
    dst_rows = dst_indices.long()
    for src, dst in zip(src_layers, dst_layers):
        dst.index_copy_(0, dst_rows, src.index_select(0, src_indices))  # = dst[dst_rows] = src[src_indices]
    VIRTUAL_DEVICE.current_stream().charge(len(src_indices), len(src_layers))


# --------------------------------------------------------------------------------------------
# Copies in virtual time


@dataclass
class CopyRate:
    """One direction of host<->device copies: a fixed latency per submission + tokens / rate."""

    tokens_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.tokens_per_s > 0 or self.latency_s < 0:
            raise ValueError(f"copy rate needs tokens_per_s > 0 and latency_s >= 0, got {self}")


class CopyEngine:
    """The GPU's host-to-device and device-to-host copy streams of one simulated engine, on its
    clock (``now()``, virtual seconds). Each direction is one stream: its copies run one after
    the other; the two directions run side by side (separate copy engines, full-duplex PCIe)."""

    def __init__(self, now: Callable[[], float], load: CopyRate, write: CopyRate) -> None:
        self.now = now
        self.rates = {"load": load, "write": write}
        self.streams: dict[str, _VirtualStream] = {}
        self._stall_until: float | None = None

    def adopt(self, stream: _VirtualStream, direction: str, kv_tensors: int) -> None:
        """``stream`` carries this direction's copies; a full copy touches ``kv_tensors`` buffers."""
        stream.bind(self, self.rates[direction], kv_tensors)
        self.streams[direction] = stream

    def busy_until(self, direction: str) -> float:
        stream = self.streams.get(direction)
        return stream.cursor if stream is not None else 0.0

    def next_landing(self) -> float | None:
        """When the last queued copy on either stream lands, if that is still ahead."""
        now = self.now()
        ahead = [s.cursor for s in self.streams.values() if s.cursor > now]
        return min(ahead) if ahead else None

    def stall(self, until: float) -> None:
        self._stall_until = until if self._stall_until is None else max(self._stall_until, until)

    def take_stall(self) -> float | None:
        """The host thread blocked on a copy (``Event.synchronize``) until this time, if it did."""
        until, self._stall_until = self._stall_until, None
        return until


class _VirtualStream:
    """A copy stream: ``cursor`` is when its queued work ends (virtual time). Unbound (no
    CopyEngine): every copy and event is immediate, as ``torch.cpu``'s stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.copies: CopyEngine | None = None
        self.rate: CopyRate | None = None
        self.kv_tensors = 1
        self.cursor = 0.0
        self.copy_from = 0.0  # when the current submission's first copy started
        self._fresh = False  # the next copy starts a submission (pays the latency)

    def bind(self, copies: CopyEngine, rate: CopyRate, kv_tensors: int) -> None:
        self.copies, self.rate, self.kv_tensors = copies, rate, max(1, kv_tensors)

    def wait_event(self, event: _VirtualEvent) -> None:
        """Work queued after this starts once ``event`` is done (a submission's start)."""
        if self.copies is None:
            return
        at = event.at if event.at is not None and event.copies is self.copies else self.copies.now()
        self.cursor = max(self.cursor, at, self.copies.now())
        self._fresh = True

    def wait_stream(self, other: Any) -> None:
        if self.copies is not None and isinstance(other, _VirtualStream) and other.copies is self.copies:
            self.cursor = max(self.cursor, other.cursor)

    def charge(self, tokens: int, tensors: int) -> None:
        if self.copies is None or self.rate is None:
            return
        if self._fresh:
            self.cursor += self.rate.latency_s
            self.copy_from = self.cursor
            self._fresh = False
        self.cursor += tokens * (tensors / self.kv_tensors) / self.rate.tokens_per_s

    def query(self) -> bool:
        return self.copies is None or self.cursor <= self.copies.now()

    def synchronize(self) -> None:
        if not self.query():
            self.copies.stall(self.cursor)


class _VirtualEvent:
    """Recorded on a bound stream: done at the stream's cursor (``at``); otherwise at once."""

    def __init__(self, *args: Any, enable_timing: bool = False, **kwargs: Any) -> None:
        self.copies: CopyEngine | None = None
        self.at: float | None = None
        self.copy_from: float | None = None
        self._waited = False

    def record(self, stream: _VirtualStream | None = None) -> None:
        stream = stream or VIRTUAL_DEVICE.current_stream()
        self.copies, self._waited = stream.copies, False
        if stream.copies is None:
            self.at = self.copy_from = None
        else:
            self.at, self.copy_from = stream.cursor, stream.copy_from

    def query(self) -> bool:
        return self.at is None or self._waited or self.at <= self.copies.now()

    def synchronize(self) -> None:
        """The host thread waits for the copy: a stall until it lands."""
        if not self.query():
            self.copies.stall(self.at)
            self._waited = True

    def wait(self, stream: _VirtualStream | None = None) -> None:
        (stream or VIRTUAL_DEVICE.current_stream()).wait_event(self)

    def elapsed_time(self, end: _VirtualEvent) -> float:
        """Milliseconds from this event to ``end`` (SGLang's load-back / backup durations)."""
        if self.at is None or end.at is None:
            return 0.0
        return (end.at - self.at) * 1e3


class _VirtualDevice:
    """The ``device_module`` namespace ``cache_controller`` and ``l2_transfer`` use."""

    Event = _VirtualEvent
    Stream = _VirtualStream
    __name__ = "sidecar_tools.simulator.hicache_cpu.VIRTUAL_DEVICE"

    def __init__(self) -> None:
        self._default = _VirtualStream()  # the forward's stream: nothing to wait for between steps
        self._local = threading.local()

    def _stack(self) -> list[_VirtualStream]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def current_stream(self, device: Any = None) -> _VirtualStream:
        stack = self._stack()
        return stack[-1] if stack else self._default

    @contextlib.contextmanager
    def stream(self, stream: _VirtualStream | None) -> Iterator[None]:
        stack = self._stack()
        stack.append(stream if stream is not None else self._default)
        try:
            yield
        finally:
            stack.pop()

    def synchronize(self, device: Any = None) -> None:
        pass


VIRTUAL_DEVICE = _VirtualDevice()


def _swap_device_module(namespace: Any) -> tuple[Any, Any]:
    """Bind the ``device_module`` of SGLang's two transfer modules; returns the previous pair."""
    from sglang.srt.managers import cache_controller
    from sglang.srt.mem_cache import l2_transfer

    saved = (cache_controller.device_module, l2_transfer.device_module)
    cache_controller.device_module = l2_transfer.device_module = namespace
    l2_transfer._timing_events_supported.cache_clear()  # cached per device module
    return saved


def _restore_device_module(saved: tuple[Any, Any]) -> None:
    from sglang.srt.managers import cache_controller
    from sglang.srt.mem_cache import l2_transfer

    cache_controller.device_module, l2_transfer.device_module = saved
    l2_transfer._timing_events_supported.cache_clear()


def install_cpu_transfers() -> None:
    """Bind the CUDA-only seams once per process (idempotent)."""
    global _installed
    if _installed:
        return
    from sglang.srt.mem_cache.pool_host import common, mha

    common.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unpinned
    if getattr(mha, "transfer_kv_direct", None) is None:
        mha.transfer_kv_direct = _transfer_kv_direct
    _swap_device_module(VIRTUAL_DEVICE)
    _installed = True


class TransferGate:
    """Completion of host<->device copies: immediate (torch.cpu) or held until ``release()``."""

    def __init__(self) -> None:
        self._held = False
        self._recorded = 0
        self._released = 0
        self.pending = 0  # events recorded while held and not released yet

    def _event(self, *args: Any, **kwargs: Any) -> _GatedEvent:
        return _GatedEvent(self)

    @contextlib.contextmanager
    def hold(self) -> Iterator[TransferGate]:
        """While inside, transfer events stay pending until ``release()``; restores the device module after."""
        import torch

        install_cpu_transfers()
        cpu = torch.cpu
        gated = types.SimpleNamespace(
            Event=self._event, Stream=cpu.Stream, stream=cpu.stream, current_stream=cpu.current_stream,
            synchronize=cpu.synchronize, __name__="TransferGate",
        )
        saved = _swap_device_module(gated)
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self.release()
            _restore_device_module(saved)

    def release(self) -> None:
        """Every copy submitted so far has landed."""
        self._released = self._recorded
        self.pending = 0


class _GatedEvent:
    def __init__(self, gate: TransferGate) -> None:
        self._gate = gate
        self._seq: int | None = None

    def record(self, stream: Any = None) -> None:
        gate = self._gate
        gate._recorded += 1
        self._seq = gate._recorded
        if not gate._held:
            gate._released = gate._recorded
        else:
            gate.pending += 1

    def query(self) -> bool:
        return self._seq is None or self._seq <= self._gate._released

    def synchronize(self) -> None:
        """A blocking wait: the copy lands (releases everything recorded up to this event)."""
        if not self.query():
            self._gate._released = max(self._gate._released, self._seq or 0)
            self._gate.pending = max(self._gate._recorded - self._gate._released, 0)

    def wait(self, stream: Any = None) -> None:
        pass

    def elapsed_time(self, other: Any) -> float:
        return 0.0


TRANSFERS = TransferGate()


SIMULATED_HOST_BUDGET_BYTES = 1 << 40  # what SGLang may book for a simulated host pool (its tensors are tiny)


def _host_ram_check_off():
    """SGLang refuses a host pool when the machine's free RAM (less a reserve of several GB) is
    below its size; the simulated pool is 1 layer x 1 head x 1 dim, so the check would only make
    a run depend on what else the machine runs. A budget scope of its own answers it instead."""
    import contextlib

    try:
        from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    except ImportError:  # an SGLang without the budget check
        return contextlib.nullcontext()
    return host_memory_budget_scope(SIMULATED_HOST_BUDGET_BYTES)


def attach_host_tier(cache: Any, *, host_tokens: int, write_policy: str = "write_through",
                     copies: CopyEngine | None = None) -> Any:
    """Give ``cache`` (a UnifiedRadixCache on CPU pools) SGLang's host tier; returns its controller.

    ``host_tokens`` sizes the host pool (SGLang adds one padding page, as it does on a GPU host).
    The HiCache server args are published only for the duration of ``init_hicache`` (it reads
    them through ``get_memory()``), then the previous configuration is restored. With
    ``copies``, the controller's two copy streams take virtual time (see ``CopyEngine``).
    """
    if write_policy not in WRITE_POLICIES:
        raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
    device_tokens = int(cache.token_to_kv_pool_allocator.size)
    if host_tokens <= 0:
        raise ValueError(f"host_tokens must be positive, got {host_tokens}")
    install_cpu_transfers()
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.runtime_context import get_context

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=cache.req_to_token_pool,
        token_to_kv_pool_allocator=cache.token_to_kv_pool_allocator,
        page_size=cache.page_size,
        tree_components=cache.tree_components,
    )
    # SGLang sizes the pool as int(device tokens x ratio); the half token keeps that exact
    ratio = (host_tokens + 0.5) / device_tokens
    override = get_context().override_server_args(
        **HICACHE_ARGS, hicache_ratio=ratio, hicache_write_policy=write_policy
    )
    server_args = override.install()
    try:
        with _host_ram_check_off():
            cache.init_hicache(server_args, params)
    finally:
        override.restore()
    controller = cache.cache_controller
    if copies is not None:
        transfers = controller.l2_transfer_engine
        if not isinstance(transfers.host_to_device_stream, _VirtualStream):
            raise RuntimeError("timed copies need the virtual device module (not inside TRANSFERS.hold())")
        kv_tensors = 2 * int(controller.mem_pool_host.anchor_entry.host_pool.layer_num)  # K and V per layer
        copies.adopt(transfers.host_to_device_stream, "load", kv_tensors)
        copies.adopt(transfers.device_to_host_stream, "write", kv_tensors)
    return controller

"""SGLang 0.5.23's HiCache host tier on a CPU: the real code, three CUDA seams replaced.

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
* **Streams and events.** ``get_device_module()`` is ``torch.cpu`` here, whose ``Stream`` and
  ``Event`` already exist and are synchronous (an event is done once recorded). For tests that
  need a transfer *in flight*, ``TRANSFERS.hold()`` swaps the ``device_module`` that
  ``l2_transfer`` and ``cache_controller`` use for ``torch.cpu`` with events that stay pending
  until ``TRANSFERS.release()`` (the copy itself is still done at submission; only its completion
  signal waits). Must be entered before ``attach_host_tier`` for the per-layer load events.

What cannot run here: the CUDA kernels' overlap with the forward (the forward waits per layer on
the load events in ``memory_pool``); the GPU timings. Importing this module does not import sglang.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

HICACHE_ARGS = {
    "enable_hierarchical_cache": True,
    "hicache_io_backend": "direct",  # the one backend whose kernel has a torch equivalent
    "hicache_mem_layout": "layer_first",
}
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

_installed = False


def _alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    """``ALLOC_MEMORY_FUNCS`` entry for a CPU-only process: nothing to pin or register."""
    import torch

    return torch.empty(dims, dtype=dtype, device=device)


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """torch stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` (token indices given in full)."""
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices] = src[src_indices]


def install_cpu_transfers() -> None:
    """Bind the two CUDA-only seams once per process (idempotent)."""
    global _installed
    if _installed:
        return
    from sglang.srt.mem_cache.pool_host import common, mha

    common.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unpinned
    if getattr(mha, "transfer_kv_direct", None) is None:
        mha.transfer_kv_direct = _transfer_kv_direct
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
        """While inside, transfer events stay pending until ``release()``; restores torch.cpu after."""
        import torch
        from sglang.srt.managers import cache_controller
        from sglang.srt.mem_cache import l2_transfer

        cpu = torch.cpu
        gated = types.SimpleNamespace(
            Event=self._event, Stream=cpu.Stream, stream=cpu.stream, current_stream=cpu.current_stream,
            synchronize=cpu.synchronize,
        )
        saved = (cache_controller.device_module, l2_transfer.device_module)
        cache_controller.device_module = l2_transfer.device_module = gated
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self.release()
            cache_controller.device_module, l2_transfer.device_module = saved

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


def attach_host_tier(cache: Any, *, host_tokens: int, write_policy: str = "write_through") -> Any:
    """Give ``cache`` (a UnifiedRadixCache on CPU pools) SGLang's host tier; returns its controller.

    ``host_tokens`` sizes the host pool (SGLang adds one padding page, as it does on a GPU host).
    The HiCache server args are published only for the duration of ``init_hicache`` (it reads
    them through ``get_memory()``), then the previous configuration is restored.
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
    override = get_context().override_server_args(
        **HICACHE_ARGS, hicache_ratio=host_tokens / device_tokens, hicache_write_policy=write_policy
    )
    server_args = override.install()
    try:
        cache.init_hicache(server_args, params)
    finally:
        override.restore()
    return cache.cache_controller

"""The SGLang stand-in the tests and the load test start: the simulated server, set up like a launch.

``SGLangStandIn(max_total_num_tokens=..., context_length=..., token_delay=...)`` is SGLang 0.5.23
started with ``--skip-tokenizer-init --enable-metrics --enable-cache-report`` on a CPU: the HTTP
contract of ``server.py`` in front of the simulated engine (SGLang's real radix cache and
admission, ``engine.py``), so ``cached_tokens``, evictions and ``/metrics`` are SGLang's own. Time
is paced instead of modelled: every engine step (a prefill, or one decode token for the whole
batch) takes ``token_delay`` seconds, 0 by default, so a stream yields one chunk per token as
fast as the loop runs. ``disable_radix_cache=True`` is SGLang's ``--disable-radix-cache``
(``nocache_engine.py``: nothing cached, no KV accounting; what a 500-session load test affords).

Test controls, all settable while it runs (``server.py`` documents them):

* the model: ``responder`` (``replies.random_responder`` by default, ``replies.scripted_responder``
  for fixed replies), cut by SGLang's stop rules (``eos_token_ids``, ``stop_token_ids``, ``ignore_eos``);
* pace: ``token_delay``, ``time_scale``; faults: ``faults`` (hang-ups, error answers, dropped
  connections, first-token delay), ``freeze()``/``thaw()``, ``healthy``;
* lifecycle: ``start``/``stop`` (killed, same state on return), ``restart(downtime)`` (a new process
  on the same port: empty cache, no sessions, fresh metrics), ``run_in_thread`` + ``call_threadsafe``;
* shared L3 storage: ``l3=SharedStorage()`` given to several stand-ins is one HiCache storage tier
  (``--hicache-storage-backend file`` on a shared path): a prompt prefix another worker wrote
  counts as cached there (``standin_storage.py``);
* what /server_info says: ``server_info_overrides`` (e.g. a larger ``max_total_num_tokens`` than
  the pool really has, so a test's admission never binds); ``api_key`` is SGLang's ``--api-key``;
* records: ``requests``, ``results``, ``aborts``, ``opened_sessions``/``closed_sessions``,
  ``flushes``, ``client_disconnects``, ``calls``, ``running_rids``; ``wait_for_requests``,
  ``wait_for_running``; ``record=False`` keeps none (a long load test), ``record_timings=True``
  keeps each request's arrival, first and last token times (served at ``server.TIMINGS_PATH``).

Usage::

    async with SGLangStandIn(max_total_num_tokens=4096) as sglang:
        ... POST f"{sglang.url}/generate" ...

    with run_in_thread(SGLangStandIn()) as url:   # synchronous clients
        ...
"""

from __future__ import annotations

from typing import Any

from sidecar_tools.simulator.costmodel import CostModel
from sidecar_tools.simulator.engine import SimEngine
from sidecar_tools.simulator.nocache_engine import NoCacheEngine
from sidecar_tools.simulator.replies import DEFAULT_EOS_IDS, Responder
from sidecar_tools.simulator.server import SimServer, run_in_thread
from sidecar_tools.simulator.standin_storage import SharedStorage

__all__ = ["SGLangStandIn", "run_in_thread"]


class SGLangStandIn(SimServer):
    def __init__(
        self,
        *,
        responder: Responder | None = None,
        seed: int = 0,
        max_total_num_tokens: int = 200_000,
        context_length: int = 40960,
        max_running_requests: int = 64,  # more than any test runs at once (SGLang sizes it from memory)
        policy: str = "lru",
        policy_config: dict[str, Any] | None = None,
        enable_session_radix_cache: bool = False,
        disable_radix_cache: bool = False,
        enable_streaming_session: bool = False,
        eos_token_ids: tuple[int, ...] = DEFAULT_EOS_IDS,
        model_path: str = "Qwen/Qwen3-8B",
        served_model_name: str | None = None,
        tokenizer_path: str | None = None,
        token_delay: float = 0.0,
        time_scale: float = 1.0,
        api_key: str | None = None,
        server_info_overrides: dict[str, Any] | None = None,
        record: bool = True,
        record_timings: bool = False,
        l3: SharedStorage | None = None,
        stream_interval: int = 1,
    ):
        if disable_radix_cache and (policy != "lru" or policy_config or enable_session_radix_cache):
            raise ValueError("without a radix cache there is no eviction policy or session cache to configure")
        self._disable_radix_cache = disable_radix_cache
        self._launch: dict[str, Any] = {"kv_tokens": max_total_num_tokens, "context_length": context_length,
                                        "max_running_requests": max_running_requests}
        if not disable_radix_cache:
            self._launch.update(policy=policy, policy_config=policy_config,
                                session_radix_cache=enable_session_radix_cache)
        self._token_delay = token_delay
        super().__init__(
            self._new_engine(), engine_factory=self._new_engine, time_scale=time_scale,
            model_name=served_model_name or model_path, model_path=model_path, tokenizer_path=tokenizer_path,
            seed=seed, responder=responder, eos_token_ids=eos_token_ids, api_key=api_key,
            enable_streaming_session=enable_streaming_session, server_info_overrides=server_info_overrides,
            record=record, record_timings=record_timings, l3=l3, stream_interval=stream_interval,
        )

    def _new_engine(self) -> SimEngine | NoCacheEngine:
        cost = CostModel.paced(self._token_delay)
        if self._disable_radix_cache:
            return NoCacheEngine(cost=cost, **self._launch)
        # one decode step at a time: a stream gets a chunk per token, as from SGLang
        return SimEngine(cost=cost, max_jump_steps=1, **self._launch)

    @property
    def token_delay(self) -> float:
        """Seconds every engine step takes: before the first token, and between tokens."""
        return self._token_delay

    @token_delay.setter
    def token_delay(self, seconds: float) -> None:
        self._token_delay = seconds
        self.engine.cost = CostModel.paced(seconds)

    @property
    def served_model_name(self) -> str:
        return self.model_name

    @property
    def max_total_num_tokens(self) -> int:
        """The KV pool /server_info reports (an override included)."""
        return self.server_info()["max_total_num_tokens"]

    @property
    def context_length(self) -> int:
        return self.engine.context_length

"""What-if simulator: replay agent traces against SGLang's real radix cache on a CPU.

``sglang-sidecar simulate`` drives SGLang 0.5.23's own ``UnifiedRadixCache`` (CPU token pool,
real eviction strategies, the ``session_ttl`` plugin included) with a batch scheduler that
mimics SGLang's (FCFS waiting queue, ``PrefillAdder`` admission, chunked prefill, continuous
batching, retraction) in virtual time. Step times come from a cost model calibrated on H200
runs (``costmodel.py``, ``calibration/``). The same engine serves SGLang's HTTP subset in real
time (``server.py``) so the sidecar runs end to end on any machine, and is the tests' SGLang
(``standin.py``).

Module map (only ``sglang_env``, ``engine`` and what imports them touch sglang; they do so lazily):

* ``costmodel``  step-time model + calibration file I/O (no sglang)
* ``sglang_env`` imports SGLang, publishes server args, loads the plugin, builds the cache
* ``engine``     the discrete-event engine (scheduler + real cache + cost model)
* ``replay``     closed-loop trace replay in virtual time, sidecar policy in the loop, one or several workers
* ``workers``    the simulated workers of a replay (an engine each), their load, worker-loss faults
* ``shared_l3``  a shared L3 KV store a re-homed session reads back instead of recomputing (no sglang)
* ``load_report`` the per-worker and worker-loss tables a several-worker replay prints (no sglang)
* ``server``     aiohttp server with SGLang's HTTP contract, driven in (scaled) real time
* ``standin``    that server set up as the tests' SGLang (paced time, restart, fault controls)
* ``nocache_engine`` the engine of ``--disable-radix-cache``, for load tests (no sglang)
* ``http_contract`` SGLang's route table, ``--api-key`` rule and SSE framing (no sglang)
* ``generate_request`` what SGLang accepts at /generate (no sglang)
* ``replies``    the simulated model's replies and SGLang's stop rules (no sglang)
* ``faults``     the fault knobs of /generate (no sglang)
* ``calibrate``  refit the cost model from GPU run JSON/CSVs
* ``cli``        the thin ``simulate`` click command
"""

__all__: list[str] = []

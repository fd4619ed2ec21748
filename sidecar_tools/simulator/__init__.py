"""What-if simulator: replay agent traces against SGLang's real radix cache on a CPU.

``sglang-sidecar simulate`` drives SGLang 0.5.23's own ``UnifiedRadixCache`` (CPU token pool,
real eviction strategies, the ``session_ttl`` plugin included) with a batch scheduler that
mimics SGLang's (FCFS waiting queue, ``PrefillAdder`` admission, chunked prefill, continuous
batching, retraction) in virtual time. Step times come from a cost model calibrated on H200
runs (``costmodel.py``, ``calibration/``). The same engine serves SGLang's HTTP subset in real
time (``server.py``) so the sidecar runs end to end on any machine.

Module map (only ``sglang_env``, ``engine`` and what imports them touch sglang; they do so lazily):

* ``costmodel``  step-time model + calibration file I/O (no sglang)
* ``sglang_env`` imports SGLang, publishes server args, loads the plugin, builds the cache
* ``engine``     the discrete-event engine (scheduler + real cache + cost model)
* ``replay``     closed-loop trace replay in virtual time, sidecar policy in the loop
* ``server``     aiohttp server with SGLang's HTTP contract, driven in (scaled) real time
* ``http_contract`` SGLang's route table, shared with the test double (no sglang)
* ``calibrate``  refit the cost model from GPU run JSON/CSVs
* ``cli``        the thin ``simulate`` click command
"""

__all__: list[str] = []

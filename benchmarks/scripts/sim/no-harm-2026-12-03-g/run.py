"""The no-harm simulator table (issue 24), round g: the door counts a prefix the open sessions share once.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-03-g/run.py --copy-stock [--jobs N] [--only W ...]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. The product is the
shipped default (the plugin with ``{"max_leased_fraction": 0.8}``, ``defer_with_host_room`` on, and
``configs/coding-agent.toml``), now with the admission door matching each new session's prompt against
the open sessions' first prompts (``sidecar.policy.shared_prefix``) and counting the prefix they share
once, as SGLang's radix tree and host tier hold it, and learning the growth per turn as a mean in which the
prior weighs as ``growth_prior_turns`` (48) turns, so a wave is not admitted on its shortest first turns. Beside the matrix: the 26-agent reference probes
(``*-n26``) and the reference as the OpenAI path renders it on the GPU (``*-openai``: the chat template's
tokens added, ``--template-tokens qwen3-openai``). The stock rows come from rounds b and f where they
exist (``--copy-stock``: the LRU path did not change); the ``*-openai`` baselines are run here.
"""

from sidecar_tools.simulator.no_harm import MATRIX_WORKLOADS, REPO, Round, product, run, stock

RESULTS = REPO / "benchmarks" / "results" / "sim"
ROUND = Round(
    out=RESULTS / "no-harm-2026-12-03-g",
    rows={"hicache": stock, "product": lambda r: product({"max_leased_fraction": 0.8}, r)},
    workloads=(*MATRIX_WORKLOADS, "miniswe-o0.4", "miniswe-o0.6", "0.5s-n26", "5s-n26",
               "0.5s-openai", "5s-openai", "5s-openai-n26"),
    stock_from=(RESULTS / "no-harm-2026-12-02-b", RESULTS / "no-harm-2026-12-03-f"),
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])

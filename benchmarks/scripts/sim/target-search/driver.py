"""Run many `sglang-sidecar simulate` commands in one process pool (shares the SGLang import).

    python3 benchmarks/scripts/sim/target-search/driver.py JOBS.json OUTDIR [WORKERS]
JOBS.json: [[name, [simulate args...]], ...]; each run is saved as OUTDIR/<name>.json (+ -turns.csv)
exactly as `sglang-sidecar simulate ... --name NAME --out OUTDIR` would save it; the command line is
appended to OUTDIR/commands.txt. Simulator results, not GPU runs.
"""
import json
import multiprocessing as mp
import shlex
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

BASE = ["--synthetic", "reference", "--kv-tokens", "173200"]


def run_one(job):
    name, args, out = job
    if (Path(out) / f"{name}.json").exists():
        return name, "cached"
    from sidecar_tools.simulator.cli import simulate
    argv = BASE + ["--name", name, "--out", out] + list(args)
    import contextlib
    import io
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            simulate.main(argv, prog_name="sglang-sidecar simulate", standalone_mode=False)
    except Exception as exc:  # noqa: BLE001
        return name, f"ERROR {exc!r}"
    return name, "ok"


def main():
    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / "commands.txt", "a") as f:
        for name, args in jobs:
            f.write(shlex.join(["sglang-sidecar", "simulate", *BASE, "--name", name, "--out", out, *args]) + "\n")
    import sidecar_tools.simulator.cli  # noqa: F401  (import SGLang once before forking)
    import sidecar_tools.simulator.engine  # noqa: F401
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        for name, status in pool.imap_unordered(run_one, [(n, a, out) for n, a in jobs]):
            s = ""
            p = Path(out) / f"{name}.json"
            if p.exists():
                m = json.loads(p.read_text())["summary"]
                s = f"{m['makespan_s']:.1f}s rec={100*m['recomputed_share']:.1f}% p50={m['ttft_p50_s']:.2f} p90={m['ttft_p90_s']:.2f}"
            print(name, status, s, flush=True)


if __name__ == "__main__":
    main()

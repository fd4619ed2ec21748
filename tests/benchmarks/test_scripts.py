"""The scripts that made the committed results (benchmarks/scripts/) and the GPU kit still run.

benchmarks/results/ holds data only; what produced it lives in benchmarks/scripts/<the results
folder>/. These tests notice when a script breaks: a syntax error, a path or module that moved, a
`sglang-sidecar simulate` / `gap-replay` flag that no longer exists, a run name the committed
tables no longer find. The simulation scripts run dry: `sglang-sidecar` is a stub on PATH that
records each command and hands back the committed run of that name, every recorded command is then
parsed by the real click command, and the scripts' own table step must rebuild the committed table.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "benchmarks" / "scripts"
RESULTS = REPO / "benchmarks" / "results"
ALL = sorted(p for p in SCRIPTS.rglob("*") if p.suffix in (".py", ".sh"))


def _id(path: Path) -> str:
    return str(path.relative_to(SCRIPTS))


def test_results_hold_data_only():
    code = sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.suffix in (".py", ".sh"))
    assert code == [], f"scripts belong in benchmarks/scripts/, not in benchmarks/results/: {code}"


@pytest.mark.parametrize("script", ALL, ids=_id)
def test_script_compiles(script: Path, tmp_path):
    if script.suffix == ".sh":
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    else:
        py_compile.compile(str(script), cfile=str(tmp_path / "x.pyc"), doraise=True)


# Repository paths a script names (files it reads or runs); outputs it writes are under OUT or $OUT.
_PATH = re.compile(r"(?<![\w$/.{-])((?:benchmarks|configs|sidecar_tools)/[\w./-]*\w\.(?:sh|py|toml|jsonl|json))")
_MODULE = re.compile(r"python3? -m ([\w.]+)")


@pytest.mark.parametrize("script", ALL, ids=_id)
def test_paths_and_modules_a_script_names_exist(script: Path):
    text = script.read_text()
    missing = [p for p in _PATH.findall(text) if not (REPO / p).exists()]
    assert missing == [], f"{_id(script)} names paths that do not exist: {missing}"
    modules = set(_MODULE.findall(text))
    assert all(importlib.util.find_spec(m) for m in modules), modules


# --- dry runs of the simulation scripts --------------------------------------------------------

_STUB = '''#!{python}
"""sglang-sidecar stand-in: record argv, copy the committed run of that name into --out."""
import json, os, shutil, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:1] == ["simulate"] and "--name" in args and "--out" in args:
    name, out = args[args.index("--name") + 1], Path(args[args.index("--out") + 1])
    committed = Path(os.environ["COMMITTED"])
    out.mkdir(parents=True, exist_ok=True)
    for suffix in (".json", "-turns.csv"):
        if (committed / (name + suffix)).exists():
            shutil.copy(committed / (name + suffix), out / (name + suffix))
    print(name + ": (dry run)")
'''


def _parse(command: click.Command, name: str, args: list[str], parent: click.Context | None = None) -> None:
    """Parse ``args`` as the real command line would (types, choices, paths that must exist)."""
    ctx = command.make_context(name, list(args), parent=parent)
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    if isinstance(command, click.Group) and rest:
        sub_name, sub, sub_args = command.resolve_command(ctx, rest)
        _parse(sub, sub_name, sub_args, ctx)


def _tool(argv: list[str]) -> tuple[click.Command, str, list[str]]:
    from sidecar_tools.gaps.gap_replay import gap_replay
    from sidecar_tools.simulator.cli import simulate

    commands = {"simulate": simulate, "gap-replay": gap_replay}
    assert argv[0] in commands, argv
    return commands[argv[0]], argv[0], argv[1:]


def _dry_run(script: str, tmp_path: Path, committed: Path, *args: str, env: dict[str, str] | None = None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "sglang-sidecar"
    stub.write_text(_STUB.format(python=sys.executable))
    stub.chmod(0o755)
    log = tmp_path / "commands.jsonl"
    log.touch()
    full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log),
                "COMMITTED": str(committed), "PYTHONPATH": str(REPO), **(env or {})}
    done = subprocess.run(["bash", str(SCRIPTS / script), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    recorded = [json.loads(line) for line in log.read_text().splitlines()]
    return recorded, done


def _assert_parse(recorded: list[list[str]], monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    assert recorded, "the script ran no command"
    for argv in recorded:
        command, name, args = _tool(argv)
        try:
            _parse(command, name, args)
        except click.ClickException as exc:
            pytest.fail(f"{shlex.join(argv)}: {exc.format_message()}")


@pytest.mark.parametrize("folder", ["sim/admission", "sim/workers-2026-12-01"])
def test_simulation_script_rebuilds_its_committed_table(folder, tmp_path, monkeypatch):
    committed = RESULTS / folder
    out = tmp_path / "out"
    recorded, _ = _dry_run(f"{folder}/run.sh", tmp_path, committed, str(out))
    _assert_parse(recorded, monkeypatch)
    names = {argv[argv.index("--name") + 1] for argv in recorded}
    assert all((committed / f"{n}.json").exists() for n in names), names - {p.stem for p in committed.glob("*.json")}
    assert (out / "table.md").read_text() == (committed / "table.md").read_text()


@pytest.mark.parametrize("folder", ["sim", "sim/h200-2026-11-30b"])
def test_simulation_script_commands_parse(folder, tmp_path, monkeypatch):
    committed = RESULTS / folder
    recorded, _ = _dry_run(f"{folder}/run.sh", tmp_path, committed, str(tmp_path / "out"), env={"WHATIF": "0"})
    _assert_parse(recorded, monkeypatch)
    runs = [argv for argv in recorded if "--name" in argv]
    assert all((committed / f"{argv[argv.index('--name') + 1]}.json").exists() for argv in runs)
    assert any(argv[:2] == ["simulate", "fidelity"] for argv in recorded)


def test_gap_replay_script_commands_parse(tmp_path, monkeypatch):
    log = tmp_path / "gap.jsonl"
    recorder = tmp_path / "record.py"
    recorder.write_text("import json, sys\nopen(sys.argv[1], 'a').write(json.dumps(['gap-replay', *sys.argv[2:]]) + '\\n')\n")
    trace = tmp_path / "trace.jsonl"
    done = subprocess.run(["bash", str(SCRIPTS / "gap-replay/run.sh"), str(tmp_path / "out")], cwd=REPO,
                          env={**os.environ, "GR": f"{sys.executable} {recorder} {log}", "TRACE": str(trace)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    recorded = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recorded) == 5
    trace.write_text((REPO / "benchmarks/data/synthetic-coding-agent-regime.jsonl").read_text())  # what the first run writes
    _assert_parse(recorded, monkeypatch)


@pytest.mark.parametrize("folder", ["sim/target-search", "sim/workers-2026-12-01", "sim/admission"])
def test_table_script_rebuilds_the_committed_table(folder):
    done = subprocess.run([sys.executable, str(SCRIPTS / folder / "table.py"), str(RESULTS / folder)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (RESULTS / folder / "table.md").read_text()


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_traces_simulate_rebuilds_its_table_and_its_commands_parse(tmp_path, monkeypatch):
    committed = RESULTS / "real-traces" / "sim"
    out = tmp_path / "sim"
    out.mkdir()
    for run in committed.glob("*-*"):
        (out / run.name).write_bytes(run.read_bytes())
    done = subprocess.run(["bash", str(SCRIPTS / "real-traces/simulate.sh"), "--table-only", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "table.md").read_text() == (committed / "table.md").read_text()

    simulate_py = _load(SCRIPTS / "real-traces" / "simulate.py")
    commands = [simulate_py.command(w, r, flags, 100_000) for w in simulate_py.WORKLOADS
                for r, (flags, _) in {**simulate_py.ROWS, **simulate_py.HICACHE_ROWS}.items()]
    assert all(cmd[1:4] == ["-m", "sidecar", "simulate"] for cmd in commands)
    for cmd in commands:  # every row is a committed run of that name
        assert (committed / f"{cmd[cmd.index('--name') + 1]}.json").exists(), cmd
    _assert_parse([cmd[3:] for cmd in commands], monkeypatch)


def test_target_search_driver_runs_a_tiny_job(tmp_path, monkeypatch):
    """One job as the pool runs it (in this process, sharing the SGLang import with the what-if test)."""
    monkeypatch.chdir(REPO)
    driver = _load(SCRIPTS / "sim" / "target-search" / "driver.py")
    out = tmp_path / "out"
    out.mkdir()
    job = ("tiny-lru", ["--sessions", "2", "--turns", "2", "--policy", "lru"], str(out))
    assert driver.run_one(job) == ("tiny-lru", "ok")
    run = json.loads((out / "tiny-lru.json").read_text())
    assert run["summary"]["turns_ok"] == 4
    assert run["config"]["kv_tokens"] == 173_200 and "--kv-tokens 173200 --policy lru --name tiny-lru" in run["command"]  # the driver's BASE
    assert driver.run_one(job) == ("tiny-lru", "cached")  # an existing run is skipped


def test_whatif_runs_a_tiny_spec(monkeypatch):
    monkeypatch.chdir(REPO)
    whatif = _load(SCRIPTS / "sim" / "whatif.py")
    cell = whatif.cell(whatif.run(sessions=2, turns=2, **whatif.product()))
    assert re.fullmatch(r"[\d.]+ s / [\d.]+ % / [\d.]+ s", cell), cell


def test_matrix_sessions_ask_for_runs_run_matrix_knows(tmp_path):
    """The GPU sessions of 2026-12-01 run specs of today's run_matrix.sh (CONFIG-WORKLOAD)."""
    matrix = (REPO / "benchmarks" / "run_matrix.sh").read_text()
    configs = set(re.findall(r"^    (\w+)\)", matrix.split("case $config in")[1].split("esac")[0], re.M))
    workloads = set(re.findall(r"^    ([\w.]+)\)", matrix.split("case $workload in")[1].split("esac")[0], re.M))
    assert {"lru", "hicache", "product", "unconstrained"} <= configs and {"0.5s", "5s", "overload"} <= workloads
    recorder = tmp_path / "matrix.sh"
    recorder.write_text('shift; echo "$@" >> "$MATRIX_LOG"\n')
    for session in ("h200-2026-12-01/session.sh", "h200-2026-12-01b/session.sh"):
        log = tmp_path / f"{session.split('/')[0]}.txt"
        done = subprocess.run(["bash", str(SCRIPTS / session), str(tmp_path / "out")], capture_output=True, text=True,
                              env={**os.environ, "MATRIX": str(recorder), "MATRIX_LOG": str(log)}, timeout=30)
        assert done.returncode == 0, done.stderr
        for spec in log.read_text().split():
            config, workload = spec.split("-", 1)
            assert config in configs and workload in workloads, (session, spec)


def test_gpu_kit_packs_wheels_into_parts_that_join_back(tmp_path):
    """benchmarks/gpu_kit/pack.py: parts under the limit, a large wheel cut and rejoined byte-exact."""
    wheels = tmp_path / "all"
    wheels.mkdir()
    blobs = {"big-1.0-py3-none-any.whl": os.urandom(300_000), "small-1.0-py3-none-any.whl": os.urandom(20_000)}
    for name, blob in blobs.items():
        (wheels / name).write_bytes(blob)
    limit_mib = 0.2
    done = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_kit/pack.py"), str(tmp_path), str(limit_mib)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parts = sorted(tmp_path.glob("part[0-9][0-9]"))
    assert len(parts) >= 2
    for part in parts:
        assert sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) <= limit_mib * (1 << 20)
    pieces = sorted(p for part in parts for p in part.glob("big-*.whl.part??"))
    assert len(pieces) == 2 and b"".join(p.read_bytes() for p in pieces) == blobs["big-1.0-py3-none-any.whl"]
    sums = (parts[0] / "SHA256SUMS").read_text()
    for name, blob in blobs.items():
        assert f"{hashlib.sha256(blob).hexdigest()}  {name}" in sums
    assert (parts[0] / "install.sh").exists() and (parts[0] / "serve.sh").exists()
    assert (parts[0] / "qwen3-8b" / "config.json").exists()

"""The GPU benchmark scripts (benchmarks/*.sh) and the steps they share (benchmarks/lib/sidecar.sh).

A whole dry run (SERVE=benchmarks/sim_serve.sh) takes minutes; here each script must parse and name
only paths that exist, and the shared library must do what both scripts rely on: start a sidecar,
record its command line, wait for its /health, stop it, and give up (stopped, logged) on one that
does not come up.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "benchmarks" / "lib" / "sidecar.sh"
GPU_SCRIPTS = sorted([*(REPO / "benchmarks").glob("*.sh"), *LIB.parent.glob("*.sh")])
_PATH = re.compile(r"(?<![\w$/.{-])((?:benchmarks|configs|sidecar_tools)/[\w./-]*\w\.(?:sh|py|toml|jsonl|json))")


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_gpu_script_parses_and_names_paths_that_exist(script: Path):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    missing = [p for p in _PATH.findall(script.read_text()) if not (REPO / p).exists()]
    assert missing == [], f"{script.name} names paths that do not exist: {missing}"


def test_both_gpu_scripts_take_the_sidecar_steps_from_the_library():
    for name in ("run_matrix.sh", "capacity_gpu.sh"):
        text = (REPO / "benchmarks" / name).read_text()
        assert 'source "$REPO/benchmarks/lib/sidecar.sh"' in text, name
        assert not re.search(r"^(start_sidecar|stop_sidecar|stop_engine|run|log)\(\)", text, re.M), name


_SIDECAR_STAND_IN = """
# `python3 -m sidecar serve ...` answers /health on SIDECAR_PORT (or fails with FAIL=1)
if [ "$1 $2 $3" = "-m sidecar serve" ]; then
  [ -n "${FAIL:-}" ] && { echo "sidecar refused to start"; exit 1; }
  exec {python} -c '
import http.server, os
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["SIDECAR_PORT"])), Health).serve_forever()'
fi
"""
_FAKE_PYTHON = "#!/usr/bin/env bash" + _SIDECAR_STAND_IN + 'exec {python} "$@"\n'

_SESSION = """
set -uo pipefail
ENGINE=http://127.0.0.1:1 PORT=no-engine-here TOK_DIR=/nonexistent
source "{lib}"
bench_setup "{repo}" "$1" bench.log
start_sidecar first --config configs/coding-agent.toml || exit 3
pid=$SIDECAR_PID
stop_sidecar
kill -0 "$pid" 2>/dev/null && exit 4
FAIL=1 SIDECAR_WAIT_S=3 start_sidecar second && exit 5
[ -z "$SIDECAR_PID" ] || exit 6
exit 0
"""


@pytest.mark.skipif(shutil.which("curl") is None, reason="the scripts wait for /health with curl")
def test_the_library_starts_records_and_stops_a_sidecar_and_gives_up_on_one_that_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(_FAKE_PYTHON.replace("{python}", sys.executable))
    fake.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = tmp_path / "session.sh"
    session.write_text(_SESSION.format(lib=LIB, repo=REPO))
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SIDECAR_PORT": str(port)}
    done = subprocess.run(["bash", str(session), str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

    commands = (out / "commands.txt").read_text().splitlines()
    assert commands[0] == (
        f"python3 -m sidecar serve --sglang-url http://127.0.0.1:1 --port {port} --tokenizer /nonexistent "
        "--config configs/coding-agent.toml &"
    )
    assert "sidecar did not come up" in (out / "logs" / "bench.log").read_text()
    assert "sidecar refused to start" in (out / "logs" / "sidecar-second.log").read_text()


# python3 stand-in for run_matrix.sh: a sidecar that answers /health, the replay recorded to $REPLAYS (not
# run), everything else real Python
_RECORDING_PYTHON = ("#!/usr/bin/env bash" + _SIDECAR_STAND_IN
                     + 'if [ "$1 $2" = "-m sidecar_tools.benchmarks.replay" ]; then echo "$@" >>"$REPLAYS"; exit 0; fi\n'
                     + 'exec {python} "$@"\n')


@pytest.mark.skipif(shutil.which("curl") is None, reason="the scripts wait for /health with curl")
def test_matrix_runs_end_before_the_device_deadline_and_skip_when_too_little_is_left(tmp_path):
    """DEADLINE (when the GPU machine goes): a run's --time-limit shrinks to end 30 s before it, so the
    replay writes what it has; a run that would get under a minute is not started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(_RECORDING_PYTHON.replace("{python}", sys.executable))
    fake.chmod(0o755)
    serve = tmp_path / "serve.sh"
    serve.write_text("exit 0\n")  # an engine that is up at once
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def matrix(out: Path, seconds_left: int) -> tuple[list[str], str]:
        replays = tmp_path / f"replays-{seconds_left}.txt"
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SIDECAR_PORT": str(port),
               "PORT": f"matrix-test-{port}", "SERVE": str(serve), "TOK_DIR": str(tok), "TIME_LIMIT": "300",
               "DEADLINE": str(int(time.time()) + seconds_left), "REPLAYS": str(replays)}
        done = subprocess.run(["bash", str(REPO / "benchmarks" / "run_matrix.sh"), str(out), "hicache-0.5s",
                               "product-5s"], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = replays.read_text().splitlines() if replays.exists() else []
        return lines, (out / "logs" / "matrix.log").read_text()

    replays, _ = matrix(tmp_path / "roomy", 200)
    limits = [int(re.search(r"--time-limit (\d+)", line).group(1)) for line in replays]
    assert len(limits) == 2 and all(150 <= limit <= 170 for limit in limits), replays

    replays, log = matrix(tmp_path / "short", 80)
    assert replays == []
    assert "no time left before DEADLINE for hicache-0.5s; skipped" in log
    assert "no time left before DEADLINE for product-5s; skipped" in log

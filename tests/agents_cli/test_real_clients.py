"""The published Claude Code and Codex CLI, unmodified and configured as README's "Point your agent
at it" says, against ``sglang-sidecar demo``: each runs two prompts non-interactively (the second
continuing the first's conversation: ``claude -c``, ``codex exec resume --last``), runs a tool the
demo's agent model calls, and gets a final answer. Every request is a 2xx, and the second
invocation continues the first's sidecar session with >= 95 % of its prompt cached.

The CLIs come from npm (``agent_clis.py``: pinned versions, installed once into a cache folder);
where npm is missing the test is skipped, unless ``SIDECAR_REQUIRE_AGENT_CLIS=1`` (``.ci/run``
sets it), which makes that a failure. Nothing but 127.0.0.1 is contacted (``agent_clis``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agent_clis import claude_code_env, codex_env, install

REPO = Path(__file__).resolve().parents[2]
SERVED = "simulated-qwen3-8b"  # the demo engine's model id (/v1/models)
DEMO_START_S = 240.0  # the simulated engine imports SGLang and torch (~45 s on a busy 2-core box)
CLI_RUN_S = 120.0
CACHED_SHARE = 0.95


@pytest.fixture(scope="module")
def clis() -> dict[str, Path]:
    try:
        return install()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("SIDECAR_REQUIRE_AGENT_CLIS") == "1":
            pytest.fail(f"the agent CLIs are required here: {exc}")
        pytest.skip(f"agent CLIs not available: {exc}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def demo(qwen3_tokenizer_dir, tmp_path_factory):
    """``sglang-sidecar demo`` (the README's command 1, on free ports); its base URL."""
    logs = tmp_path_factory.mktemp("demo")
    port, engine_port = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "sidecar", "demo", "--tokenizer", str(qwen3_tokenizer_dir),
           "--config", str(REPO / "configs" / "coding-agent.toml"), "--port", str(port),
           "--engine-port", str(engine_port), "--engine-log", str(logs / "engine.log")]
    out = open(logs / "demo.log", "wb")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEMO_START_S
        while not _answers(url + "/v1/models"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the demo did not come up: {(logs / 'demo.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # it stops its engine with itself
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_RUN_S)
    assert done.returncode == 0, f"{cmd}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _sessions(url: str) -> dict[str, int]:
    return {s["id"]: s["turns"] for s in httpx.get(url + "/v1/sessions").json()["data"]}


def _statuses(url: str) -> dict[tuple[str, str], float]:
    """sidecar_requests_total by (route, status), from /metrics."""
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("sidecar_requests_total{"):
            labels, value = line[len("sidecar_requests_total{"):].split("} ")
            fields = dict(part.split("=", 1) for part in labels.split(","))
            out[(fields["route"].strip('"'), fields["status"].strip('"'))] = float(value)
    return out


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello\n")
    return project


def _continues(url: str, before: dict[str, int], after_first: dict[str, int], after_second: dict[str, int]) -> None:
    """The first invocation opened sessions; the second opened none and went on in one of them."""
    opened = set(after_first) - set(before)
    assert opened, "the first invocation opened no session"
    assert set(after_second) == set(after_first), "the second invocation started a new session"
    assert any(after_second[s] > after_first[s] for s in opened)


def _all_2xx(url: str, route: str) -> None:
    statuses = _statuses(url)
    assert any(r == route for r, _ in statuses), statuses
    assert all(s.startswith("2") for (r, s) in statuses if r.startswith("/v1/") or r == "/"), statuses


def test_claude_code_runs_a_tool_and_continues_its_session(clis, demo, tmp_path):
    project = _project(tmp_path)
    env = claude_code_env(tmp_path / "home", demo, SERVED)
    before = _sessions(demo)
    first = json.loads(_run([str(clis["claude"]), "-p", "list the files here", "--output-format", "json"], project, env))
    assert first["is_error"] is False and first["num_turns"] >= 2, first  # a tool call, then the answer
    assert "notes.txt" in first["result"], first  # what the tool (Bash: ls) printed
    after_first = _sessions(demo)
    second = json.loads(_run([str(clis["claude"]), "-c", "-p", "list them again", "--output-format", "json"], project, env))
    assert second["is_error"] is False and second["session_id"] == first["session_id"], second
    usage = second["usage"]  # the sidecar's Anthropic accounting, summed over the invocation's requests
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert usage["cache_read_input_tokens"] >= CACHED_SHARE * prompt, usage
    _continues(demo, before, after_first, _sessions(demo))
    _all_2xx(demo, "/v1/messages")


def _codex_events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_codex_runs_a_tool_and_continues_its_session(clis, demo, tmp_path):
    project = _project(tmp_path)
    env = codex_env(tmp_path / "home", demo, SERVED)
    codex = str(clis["codex"])
    before = _sessions(demo)
    first = _codex_events(_run([codex, "exec", "--skip-git-repo-check", "--json", "list the files here"], project, env))
    ran = [e["item"] for e in first if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"]
    assert ran and "notes.txt" in ran[0]["aggregated_output"] and ran[0]["exit_code"] == 0, first
    answers = [e["item"]["text"] for e in first if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert answers and "notes.txt" in answers[-1], first
    (so_far,) = [e["usage"] for e in first if e.get("type") == "turn.completed"]
    after_first = _sessions(demo)
    second = _codex_events(_run([codex, "exec", "--skip-git-repo-check", "--json", "resume", "--last", "list them again"], project, env))
    (total,) = [e["usage"] for e in second if e.get("type") == "turn.completed"]
    # a resumed thread reports its usage since it began: the second invocation's is the difference
    # (OpenAI's accounting: cached tokens are part of input_tokens)
    prompt = total["input_tokens"] - so_far["input_tokens"]
    cached = total["cached_input_tokens"] - so_far["cached_input_tokens"]
    assert prompt > 0 and cached >= CACHED_SHARE * prompt, (so_far, total)
    _continues(demo, before, after_first, _sessions(demo))
    _all_2xx(demo, "/v1/responses")


SHELL = {"name": "shell", "description": "Run a shell command and return its output",
         "schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def test_the_openai_sdk_completes_a_tool_loop_against_the_demo(demo):
    """The official openai client: the demo's model calls the offered tool, then answers and stops."""
    from openai import OpenAI

    client = OpenAI(base_url=demo + "/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "function": {"name": SHELL["name"], "description": SHELL["description"],
                                               "parameters": SHELL["schema"]}}]
    messages = [{"role": "user", "content": "list the files here"}]
    first = client.chat.completions.create(model=SERVED, messages=messages, tools=tools, max_tokens=200)
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "shell" and isinstance(json.loads(call.function.arguments), dict)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "README.md\nsetup.py"}]
    final = client.chat.completions.create(model=SERVED, messages=messages, tools=tools, max_tokens=200)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert final.usage.prompt_tokens_details.cached_tokens > 0  # the same session, continued


def test_the_anthropic_sdk_completes_a_tool_loop_against_the_demo(demo):
    """The official anthropic client: tool_use, then tool_result, then end_turn."""
    import anthropic
    client = anthropic.Anthropic(base_url=demo, api_key="unused", max_retries=0)
    tools = [{"name": SHELL["name"], "description": SHELL["description"], "input_schema": SHELL["schema"]}]
    messages = [{"role": "user", "content": "list the files here"}]
    first = client.messages.create(model=SERVED, max_tokens=200, messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "shell" and isinstance(use.input, dict)
    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "README.md"}]}]
    final = client.messages.create(model=SERVED, max_tokens=200, messages=messages, tools=tools)
    assert final.stop_reason == "end_turn" and any(block.type == "text" and block.text for block in final.content)
    assert final.usage.cache_read_input_tokens > 0

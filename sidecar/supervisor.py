"""The engine as a child of the sidecar: ``sglang-sidecar serve -- <engine command>`` and
``sglang-sidecar demo`` start it, wait until it answers /health, and stop it with the sidecar.

The engine (SGLang's launch_server, or the simulator) runs in a process group of its own, so
Ctrl+C in the terminal reaches only the sidecar, which then stops the whole group: SIGTERM, a
grace period, SIGKILL for whatever is left. SIGTERM and SIGHUP to the sidecar do the same, and on
Linux the engine is also told to stop if the sidecar dies without cleaning up (SIGKILL). No orphan
keeps the engine's port. If the engine exits on its own, the sidecar stops too. Standard library
only: the serving process loads nothing more for it (and never the simulator: the demo's engine
is a command line like any other).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("sidecar.supervisor")

STOP_GRACE_S = 15.0
POLL_S = 0.25
NOTE_EVERY_S = 30.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the engine is local: no HTTP proxy


class EngineFailed(Exception):
    """The engine could not be started or did not come up; the message says why, for the user."""


def answers_health(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url``/health answers 200 now."""
    try:
        with _NO_PROXY.open(url.rstrip("/") + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_free(host: str, port: int) -> bool:
    """Whether the sidecar could listen on ``host:port`` (checked before an engine is started for it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp listens
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _stop_with_parent() -> Callable[[], None] | None:
    """Linux: a pre-exec hook that has the kernel send the child SIGTERM when the sidecar dies.
    Resolved here, before the fork, so the child only makes one call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


class EngineProcess:
    """One engine command line, run as the leader of its own process group."""

    def __init__(self, argv: list[str], url: str, log_path: str | None = None, relay_lines: bool = False):
        """``relay_lines``: without ``log_path``, the engine's output is read line by line and logged
        (logger ``sidecar.engine``) rather than left on the terminal, so --log-format json keeps
        stderr one JSON object a line."""
        if not argv:
            raise ValueError("an engine command is needed")
        self.argv, self.url, self.log_path = list(argv), url, log_path
        self.relay_lines = relay_lines and log_path is None
        self.proc: subprocess.Popen | None = None
        self.exited_first = False  # it exited on its own while the sidecar served

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if answers_health(self.url):
            raise EngineFailed(
                f"something already answers at {self.url}: an engine left running? Stop it, or start this one on another port"
            )
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - the child holds it
        if self.relay_lines:
            out = subprocess.PIPE
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,  # its own process group: the terminal's Ctrl+C is the sidecar's to handle
                preexec_fn=_stop_with_parent(),
            )
        except OSError as exc:
            raise EngineFailed(f"cannot start the engine ({self.argv[0]}): {exc}") from None
        finally:
            if out is not None and out is not subprocess.PIPE:
                out.close()
        if self.relay_lines:
            threading.Thread(target=_relay, args=(self.proc.stdout,), name="engine-output", daemon=True).start()
        log.info("started the engine, pid %d (process group %d): %s", self.proc.pid, self.proc.pid, " ".join(self.argv))

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.proc.poll() if self.proc is not None else None

    def wait_ready(self, timeout_s: float) -> float:
        """Block until the engine answers /health; the seconds that took. EngineFailed if it exits
        or is not up within ``timeout_s``."""
        started = time.monotonic()
        next_note = started + NOTE_EVERY_S
        log.info("waiting up to %g s for the engine at %s/health", timeout_s, self.url)
        while True:
            code = self.exit_code()
            if code is not None:
                where = f"; its output is in {self.log_path}" if self.log_path else ""
                raise EngineFailed(f"the engine exited with code {code} before it answered {self.url}/health{where}")
            if answers_health(self.url):
                took = time.monotonic() - started
                log.info("the engine answers at %s after %.1f s", self.url, took)
                return took
            now = time.monotonic()
            if now - started > timeout_s:
                raise EngineFailed(f"the engine did not answer {self.url}/health within {timeout_s:g} s")
            if now >= next_note:
                log.info("still waiting for the engine (%.0f s)", now - started)
                next_note += NOTE_EVERY_S
            time.sleep(POLL_S)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """Stop the whole process group: SIGTERM, up to ``grace_s`` for the leader to exit, then
        SIGKILL for anything left in the group. Returns the leader's exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            log.info("stopping the engine (pid %d)", proc.pid)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("the engine did not stop within %g s; killing its process group", grace_s)
        _signal_group(proc.pid, signal.SIGKILL)  # what the leader left behind, if anything
        code = proc.wait()
        log.info("the engine stopped (exit code %d)", code)
        return code


def _relay(stream) -> None:
    """Each line the engine writes, logged (until it closes its output)."""
    engine_log = logging.getLogger("sidecar.engine")
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            engine_log.info("%s", line)
    stream.close()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl+C does, so one cleanup path runs for all
    three (aiohttp's own handlers take over SIGTERM while it serves). A signal the process was
    started ignoring stays ignored (``nohup`` keeps working)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {
        sig: signal.signal(sig, interrupt)
        for sig in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def engine_watch(engine: EngineProcess):
    """An aiohttp cleanup context: :func:`stop_when_engine_exits` runs while the app serves."""

    async def context(app) -> AsyncIterator[None]:
        task = asyncio.create_task(stop_when_engine_exits(engine))
        yield
        task.cancel()

    return context


async def stop_when_engine_exits(engine: EngineProcess, interval_s: float = 1.0) -> None:
    """Run while the sidecar serves: when the engine exits on its own, ask the sidecar to stop
    (SIGTERM to itself, which aiohttp turns into a graceful shutdown)."""
    while engine.exit_code() is None:
        await asyncio.sleep(interval_s)
    engine.exited_first = True
    log.error("the engine (pid %d) exited with code %d; stopping the sidecar", engine.pid, engine.exit_code())
    signal.raise_signal(signal.SIGTERM)

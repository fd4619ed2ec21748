"""`sglang-sidecar`: the command line. Flags of `serve` are generated from the settings model."""

from __future__ import annotations

import asyncio
import gc
import sys
import typing
from typing import Any, Literal

import click

from sidecar.settings import SettingsError, flag_name, iter_fields, load_settings


def _click_type(annotation) -> tuple[Any, bool]:
    """(click type, is_bool) for a settings field annotation (Optional and Literal unwrapped)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)]), False
    if args and typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return _click_type(args[0])
    if annotation is bool:
        return bool, True
    return {int: int, float: float, str: str}.get(annotation, str), False


def settings_options(command):
    """Decorate a click command with one option per setting; values land in kwargs['overrides']."""
    for section, name, info in reversed(list(iter_fields())):
        ctype, is_bool = _click_type(info.annotation)
        flag = flag_name(section, name)
        default = info.default if info.default is not None else "none"
        help_text = f"{info.description} [default: {default}]"
        decl = f"--{flag}/--no-{flag}" if is_bool else f"--{flag}"
        command = click.option(decl, f"opt__{section}__{name}", type=None if is_bool else ctype, default=None, help=help_text)(
            command
        )
    return command


def collect_overrides(kwargs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for key in list(kwargs):
        if key.startswith("opt__"):
            value = kwargs.pop(key)
            if value is not None:
                _, section, name = key.split("__", 2)
                overrides.setdefault(section, {})[name] = value
    return overrides


TOOL_COMMANDS_GROUP = "sglang_sidecar.commands"


def tool_commands() -> dict[str, Any]:
    """The entry points of the tool commands installed packages declare (not loaded)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=TOOL_COMMANDS_GROUP)}


class _ToolCommands(click.Group):
    """Offers the tool commands (simulator, gap replay) that installed packages declare under the
    ``sglang_sidecar.commands`` entry point group, importing one only when it is invoked, so the
    serving process never loads the tooling and ``--help`` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(tool_commands()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        entry = tool_commands().get(name)
        return entry.load() if entry is not None else None


@click.group(cls=_ToolCommands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def main() -> None:
    """Agent-session sidecar for SGLang: OpenAI-compatible, token-exact sessions, KV leases."""


_CONFIG = click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file; flags override it.")
_ENGINE_LOG = click.option(
    "--engine-log", type=click.Path(dir_okay=False), default=None, help="Append the engine's output to this file (default: this terminal)."
)


@main.command(context_settings={"allow_interspersed_args": False})
@_CONFIG
@_ENGINE_LOG
@click.option("--engine-start-timeout", type=float, default=900.0, show_default=True,
              help="With an engine command: seconds its /health may take to answer (model loading).")
@click.argument("engine_command", nargs=-1, type=click.UNPROCESSED, metavar="[-- ENGINE COMMAND...]")
@settings_options
def serve(config_file: str | None, engine_log: str | None, engine_start_timeout: float, engine_command: tuple[str, ...],
          **kwargs: Any) -> None:
    """Serve three front doors, /v1/chat/completions (OpenAI), /v1/messages (Anthropic: Claude Code) and
    /v1/responses (OpenAI Responses: Codex), in front of SGLang's native /generate.

    With an engine command after `--` (e.g. `-- python3 -m sglang.launch_server --model-path M --port 30000
    ...`) the sidecar starts it in a process group of its own, waits for its /health at --sglang-url, and
    stops the group with itself (Ctrl+C, SIGTERM; it stops too if the engine exits)."""
    settings = _settings(config_file, collect_overrides(kwargs))
    _serve(settings, list(engine_command), engine_log, engine_start_timeout)


@main.command()
@_CONFIG
@_ENGINE_LOG
@click.option("--kv-tokens", type=int, default=173_200, show_default=True, help="KV pool of the simulated engine (tokens).")
@click.option("--engine-port", type=int, default=30000, show_default=True, help="Port of the simulated engine (127.0.0.1).")
@click.option("--engine-policy", default="session_ttl", show_default=True,
              help="Its --radix-eviction-policy: session_ttl (this project's plugin), lru (stock SGLang), ...")
@click.option("--hicache-ratio", type=float, default=3.0, show_default=True,
              help="Its host-RAM tier (SGLang's --hicache-ratio: host pool = ratio x KV pool); 0 = none.")
@click.option("--engine-replies", type=click.Choice(["agent", "random"]), default="agent", show_default=True,
              help="What its model says: agent (a scripted agent's model: one tool call to a tool the request offers, "
                   "then a short answer, each ending with EOS) or random (tokens up to max_tokens, for load tests).")
@settings_options
def demo(config_file: str | None, engine_log: str | None, kv_tokens: int, engine_port: int, engine_policy: str,
         hicache_ratio: float, engine_replies: str, **kwargs: Any) -> None:
    """The main job on any machine: the simulated SGLang engine (SGLang's real radix cache with its
    host tier and this project's plugin, on the CPU, in real time) on --engine-port, the sidecar in front of it; Ctrl+C
    stops both. Needs --tokenizer (python3 -m sidecar_tools.benchmarks.qwen3_tokenizer DIR builds Qwen3's)."""
    overrides = collect_overrides(kwargs)
    if "sglang_url" in overrides.get("server", {}):
        raise click.UsageError("demo starts its own engine on 127.0.0.1:--engine-port; --sglang-url is for serve")
    url = f"http://127.0.0.1:{engine_port}"
    from sidecar import supervisor

    if not supervisor.port_free("127.0.0.1", engine_port):
        raise click.ClickException(
            f"cannot start the engine on 127.0.0.1:{engine_port}: the port is in use (another engine or server?); "
            "pick another with --engine-port"
        )
    overrides.setdefault("server", {})["sglang_url"] = url
    settings = _settings(config_file, overrides)
    tokenizer = settings.server.tokenizer
    if not tokenizer:
        raise click.UsageError("demo needs --tokenizer DIR (python3 -m sidecar_tools.benchmarks.qwen3_tokenizer DIR builds Qwen3's offline)")
    if "simulate" not in tool_commands():
        raise click.ClickException("the simulator is not installed here: pip install -e '.[plugin,bench]'")
    engine = [sys.executable, "-m", "sidecar", "simulate", "--serve", "--host", "127.0.0.1", "--port", str(engine_port),
              "--policy", engine_policy, "--kv-tokens", str(kv_tokens), "--tokenizer-path", tokenizer,
              "--replies", engine_replies]
    if hicache_ratio > 0:
        engine += ["--hicache-ratio", str(hicache_ratio)]
    _serve(settings, engine, engine_log, start_timeout=300.0)


def _settings(config_file: str | None, overrides: dict[str, dict[str, Any]]):
    try:
        return load_settings(config_file, overrides)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def _serve(settings, engine_command: list[str], engine_log: str | None, start_timeout: float) -> None:
    """Serve until stopped; with an engine command, start it first and stop it afterwards."""
    from aiohttp import web

    from sidecar import logs, supervisor
    from sidecar.server.app import StartupError, create_app, load_tokenizer

    server = settings.server
    logs.configure(server.log_level, server.log_format)
    if engine_command and not supervisor.port_free(server.host, server.port):
        raise click.ClickException(f"cannot listen on {server.host}:{server.port}: the address is in use; pick another with --port")
    as_json = server.log_format == "json"  # then stderr stays one JSON object a line: the engine's lines are logged
    engine = supervisor.EngineProcess(engine_command, server.sglang_url, engine_log, relay_lines=as_json) if engine_command else None
    stops = "it" if engine is None else "it and the engine"
    try:
        with supervisor.stop_signals_interrupt():
            tokenizer = load_tokenizer(server.tokenizer) if server.tokenizer else None
            if engine is not None:
                engine.start()
                engine.wait_ready(start_timeout)
                stops += f" (pid {engine.pid})"
            app = create_app(settings, tokenizer=tokenizer)
            app.on_startup.append(_tune_gc_for_serving)  # after the app's own startup (tokenizer loaded)
            if engine is not None:
                app.cleanup_ctx.append(supervisor.engine_watch(engine))
            web.run_app(
                app,
                loop=new_event_loop(server.event_loop),
                host=server.host,
                port=server.port,
                handler_cancellation=True,
                access_log=None,
                print=lambda _: _say_listening(f"http://{server.host}:{server.port}", stops, as_json),
            )
    except KeyboardInterrupt:  # Ctrl+C, SIGTERM or SIGHUP before serving began
        pass
    except (StartupError, supervisor.EngineFailed) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {server.host}:{server.port} (--host/--port): {exc}") from None
    finally:
        if engine is not None:
            engine.stop()
    if engine is not None and engine.exited_first:
        raise click.ClickException(f"the engine exited (code {engine.exit_code()}); the sidecar stopped with it")


def _say_listening(url: str, stops: str, as_json: bool) -> None:
    """Said once the socket is bound (aiohttp's print hook runs after its sites started)."""
    text = f"ready, listening: point an OpenAI client at {url}/v1, Anthropic's at {url} (Ctrl+C stops {stops})"
    if as_json:
        import logging

        logging.getLogger("sidecar").info("%s", text)
    else:
        click.echo(f"\nsidecar {text}\n", err=True)


YOUNG_GC_AFTER_ALLOCATIONS = 20_000  # CPython's default is 700
FULL_GC_AFTER_GEN1_PASSES = 100  # CPython's default is 10


async def _tune_gc_for_serving(app) -> None:
    """Process-wide, so it belongs to the process that serves, not to the app factory.

    transformers (and the torch it imports) leave hundreds of thousands of long-lived objects; a
    full GC pass over them stalls every stream, so they are frozen out of the collector. A full pass
    still walks every live session and connection and in the load tests never found anything to
    free (request garbage dies young), so it runs 10x less often. (The stall sizes were measured in
    an earlier round's load runs, which are not committed.) A young pass comes every 20,000 net
    allocations instead of 700 (with hundreds of streams in flight, fewer passes, and fewer of the
    turns' live objects promoted into the generations walked later): the collector's functions were 12 % of the saturated sidecar's CPU, 5 % after (perf at
    700 sessions, ``benchmarks/results/load/ceiling-2026-12-02-perf-*.txt``).
    """
    gc.collect()
    gc.freeze()
    _, gen1, _ = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_AFTER_ALLOCATIONS, gen1, FULL_GC_AFTER_GEN1_PASSES)


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """uvloop's loop (optional dependency) when asked for or, with auto, when installed."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise click.ClickException("--event-loop uvloop: the uvloop package is not installed") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@main.command("settings")
@click.option("--format", "fmt", type=click.Choice(["toml", "markdown"]), default="toml", show_default=True)
def settings_command(fmt: str) -> None:
    """Print every setting with its flag, default and meaning (a config template, or a table)."""
    from sidecar.settings import settings_reference

    click.echo(settings_reference(fmt))


if __name__ == "__main__":
    sys.exit(main())

"""`sglang-sidecar`: the command line. Flags of `serve` are generated from the settings model."""

from __future__ import annotations

import asyncio
import gc
import logging
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


class _ToolCommands(click.Group):
    """Offers the tool commands (simulator, gap replay) that installed packages declare under the
    ``sglang_sidecar.commands`` entry point group, importing one only when it is invoked, so the
    serving process never loads the tooling and ``--help`` stays fast."""

    def _tools(self) -> dict[str, Any]:
        from importlib.metadata import entry_points

        return {ep.name: ep for ep in entry_points(group=TOOL_COMMANDS_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._tools()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        entry = self._tools().get(name)
        return entry.load() if entry is not None else None


@click.group(cls=_ToolCommands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def main() -> None:
    """Agent-session sidecar for SGLang: OpenAI-compatible, token-exact sessions, KV leases."""


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file; flags override it.")
@settings_options
def serve(config_file: str | None, **kwargs: Any) -> None:
    """Serve /v1/chat/completions in front of SGLang's native /generate."""
    from aiohttp import web

    from sidecar.server.app import StartupError, create_app, load_tokenizer

    try:
        settings = load_settings(config_file, collect_overrides(kwargs))
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(
        level=settings.server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        tokenizer = load_tokenizer(settings.server.tokenizer) if settings.server.tokenizer else None
        app = create_app(settings, tokenizer=tokenizer)
        app.on_startup.append(_tune_gc_for_serving)  # after the app's own startup (tokenizer loaded)
        web.run_app(
            app,
            loop=new_event_loop(settings.server.event_loop),
            host=settings.server.host,
            port=settings.server.port,
            handler_cancellation=True,
            access_log=None,
            print=lambda msg: click.echo(msg, err=True),
        )
    except StartupError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {settings.server.host}:{settings.server.port}: {exc}") from None


FULL_GC_AFTER_GEN1_PASSES = 100  # CPython's default is 10


async def _tune_gc_for_serving(app) -> None:
    """Process-wide, so it belongs to the process that serves, not to the app factory.

    transformers (and the torch it imports) leave hundreds of thousands of long-lived objects; a
    full GC pass over them stalls every stream, so they are frozen out of the collector. A full pass
    still walks every live session and connection and in the load tests never found anything to
    free (request garbage dies young), so it runs 10x less often. (The stall sizes were measured in
    an earlier round's load runs, which are not committed.)
    """
    gc.collect()
    gc.freeze()
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, FULL_GC_AFTER_GEN1_PASSES)


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

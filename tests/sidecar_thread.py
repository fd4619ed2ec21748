"""The sidecar app served from a background thread, for tests that drive it with sync clients."""

from __future__ import annotations

from sidecar_tools.simulator.http_contract import serve_in_thread


class _SidecarServer:
    """``create_app(settings)`` behind the start/stop interface ``serve_in_thread`` serves."""

    def __init__(self, settings, tokenizer=None):
        self.settings, self.tokenizer, self.runner = settings, tokenizer, None

    async def start(self, host: str, port: int) -> str:
        from aiohttp import web

        from sidecar.server.app import create_app

        self.runner = web.AppRunner(create_app(self.settings, tokenizer=self.tokenizer), handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port).start()
        return f"http://{host}:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()


def sidecar_in_thread(settings, tokenizer=None):
    """Serve ``create_app(settings)`` on its own loop and port; a context manager yielding its base URL."""
    return serve_in_thread(_SidecarServer(settings, tokenizer), timeout=60.0, name="sidecar")

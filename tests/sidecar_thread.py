"""The sidecar app served from a background thread, for tests that drive it with sync clients."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager


@contextmanager
def sidecar_in_thread(settings, tokenizer=None):
    """Serve ``create_app(settings)`` on its own loop and port; yields its base URL."""
    from aiohttp import web

    from sidecar.app import create_app

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    async def start():
        runner = web.AppRunner(create_app(settings, tokenizer=tokenizer), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["url"] = runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60), "sidecar did not start"
    try:
        yield box["url"]
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

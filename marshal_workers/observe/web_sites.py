"""What the two aiohttp servers (``dashboard``, ``serve``) share: opening the port, and waiting for a stop signal."""

from __future__ import annotations

import asyncio
import errno
import signal
import ssl

from aiohttp import web

from marshal_workers.errors import ConfigError


async def open_site(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None, what: str, option: str
) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on host:port; return its runner and URL.  A port in use is a ConfigError naming ``option``."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, shutdown_timeout=5.0)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{what} port {port} is in use on {host}: choose another {option}") from None
        raise ConfigError(f"cannot serve {what} on {host}:{port}: {exc}") from None
    scheme = "https" if ssl_context is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{scheme}://{shown}:{port}/"


async def stop_signal(stop: asyncio.Event | None = None) -> None:
    """Return at SIGTERM or SIGINT, or when ``stop`` is set (the handlers only record the signal; the caller does
    the rest)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()

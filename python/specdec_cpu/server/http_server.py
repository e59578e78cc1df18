"""Run the OpenAI-compatible app with uvicorn, as ``specdec-cpu serve`` does.

Shutdown (SIGTERM or SIGINT, which uvicorn handles): the listening socket
closes at once, requests in flight are given ``grace`` seconds to finish,
then the decoder is closed and the process exits 0.  A model that fails to
load stops the server with exit code 1 (``/health`` says why meanwhile).
The port is taken before the model starts loading, so a port in use is an
error at once, not after a load of minutes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Callable, Optional

from ..decoding.batched import BatchedDecoder
from .openai_app import ServerOptions, create_app

__all__ = ["listen", "run_server"]


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (OSError naming both when the
    port is taken or the address is not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise OSError(f"cannot listen on {host}:{port}: {why}") from None


def run_server(load: Callable[[], BatchedDecoder], options: ServerOptions, *, host: str = "127.0.0.1",
               port: int = 8000, grace: float = 30.0, log_level: str = "info",
               listener: Optional[socket.socket] = None) -> int:
    """Serve until told to stop; returns the process's exit code.
    ``listener``: a socket from ``listen`` (default: one made here, before
    the model starts loading)."""
    import uvicorn

    sock = listener if listener is not None else listen(host, port)

    failed: list[str] = []
    server: Optional[uvicorn.Server] = None

    def load_failed(reason: str) -> None:
        failed.append(reason)
        if server is not None:
            server.should_exit = True

    app = create_app(load, options, on_load_error=load_failed)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=grace, lifespan="on", log_config=_log_config(log_level))
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal
    # again under the handlers it found: with these the process exits 0
    # (a drained shutdown is a success), not killed by the signal.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if failed or not server.started else 0


def _stopped(signum: int, frame: object) -> None:
    """The re-raised shutdown signal: already handled."""


def _log_config(level: str) -> dict:
    """uvicorn's own lines and ours, one line each, on stderr."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": fmt}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                                "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "specdec_cpu": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
        },
    }


logging.getLogger("specdec_cpu").addHandler(logging.NullHandler())

"""Run the OpenAI-compatible app with uvicorn, as ``specdec-cpu serve`` does.

Shutdown (SIGTERM or SIGINT, which uvicorn handles): the listening socket
closes at once, requests in flight are given ``grace`` seconds to finish,
then the decoder is closed and the process exits 0.  A model that fails to
load stops the server with exit code 1 (``/health`` says why meanwhile).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Callable, Optional

from ..decoding.batched import BatchedDecoder
from .openai_app import ServerOptions, create_app

__all__ = ["run_server"]


def run_server(load: Callable[[], BatchedDecoder], options: ServerOptions, *, host: str = "127.0.0.1",
               port: int = 8000, grace: float = 30.0, log_level: str = "info") -> int:
    """Serve until told to stop; returns the process's exit code."""
    import uvicorn

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
        server.run()
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

"""Running ``specdec-cpu serve`` in a subprocess for the server tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

import httpx

from specdec_cpu.server.listen_ports import free_port_range


def free_port() -> int:
    """A port to listen on that the OS does not hand out for the server's own
    connections and Ray's processes meanwhile (listen_ports)."""
    return free_port_range()


class ServerProcess:
    """``specdec-cpu serve ARGS --port P`` until :meth:`stop`; logs kept in a file."""

    def __init__(self, args: Sequence[str], tmp_path, *, ready: bool = True, timeout: float = 120.0,
                 env: Optional[dict] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"server-{self.port}.log"
        self._log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "specdec_cpu.cli", "serve", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        if ready:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        if not self._log.closed:  # after stop() the file is complete and closed
            self._log.flush()
        return self.log_path.read_text()

    def metric(self, name: str, headers: Optional[dict] = None) -> float:
        """One sample of ``/metrics`` by its full name (labels included, as printed)."""
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name} in:\n{text}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not stop within {timeout} s:\n{self.logs()}")
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""What the engine adapters share: the :class:`Engine` interface, its inputs and outputs, and
starting, probing and stopping a server process.

An engine starts for K sequences (``start(k, threads)``), then serves streamed requests
(``request`` fills a :class:`Request`; bench/serving.py) or audited sequences (``start_audit``,
then ``run(jobs, setting)``: one :class:`Sample` per :class:`Job`; bench/audit.py).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..common import quote

#: Tokens of context per sequence in the serving and audit studies (prompt and new tokens).
N_CTX = 1024


def shown(cmd: Sequence[str], masked: Optional[Dict[str, str]] = None) -> str:
    """A command as one shell line, the cache directory written ``<cache>`` (no machine paths in
    results); ``masked`` replaces the value after each of its flags (e.g. ``{"--port": "PORT"}``)."""
    from specdec_cpu.paths import cache_dir

    cmd = [str(c) for c in cmd]
    for flag, value in (masked or {}).items():
        cmd[cmd.index(flag) + 1] = value
    return " ".join(quote(c) for c in cmd).replace(str(cache_dir()), "<cache>")


def pair_paths() -> Tuple[str, str]:
    """The demo pair's files: the F32 target and the Q4_0 draft (downloaded once)."""
    from specdec_cpu.demo_models import ensure_model

    from ..suite import F32, Q4_0

    return str(ensure_model(F32)), str(ensure_model(Q4_0))


# processes ----------------------------------------------------------------


def tool_env() -> Dict[str, str]:
    """The environment of a llama.cpp tool (C locale: its numbers are parsed)."""
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    return env


def free_port() -> int:
    """A TCP port nobody listens on right now, and none the OS hands out by
    itself to the server's own connections in the meantime."""
    from specdec_cpu.server.listen_ports import free_port_range

    return free_port_range()


def http_ok(url: str, path: str, timeout: float = 5.0) -> bool:
    """Whether ``GET url + path`` answers 200."""
    conn = http.client.HTTPConnection(url.split("://", 1)[-1].rstrip("/"), timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False  # not listening yet
    finally:
        conn.close()


def wait_ready(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float,
               fail: Callable[[str], Exception]) -> None:
    """Poll ``ready`` until it holds; ``fail(why)`` is raised if ``proc`` exits or ``timeout`` s pass."""
    deadline, delay = time.monotonic() + timeout, 0.05
    while True:
        if proc.poll() is not None:
            raise fail(f"exited with {proc.returncode} while starting")
        if ready():
            return
        if time.monotonic() > deadline:
            raise fail(f"not ready after {timeout:.0f} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def stop_process(proc: Optional[subprocess.Popen], timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


# streamed requests (serving) ------------------------------------------------


@dataclass
class Request:
    """What one client measured."""

    stream: int
    sent: float  # seconds since the run started
    first: Optional[float] = None  # first piece received
    done: Optional[float] = None
    tokens: int = 0
    arrivals: List[float] = field(default_factory=list)  # each piece, seconds since sent
    error: Optional[str] = None
    decoder_ttft: Optional[float] = None  # ours called directly: submission → first token, as the decoder saw it

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first is None else self.first - self.sent

    def gaps(self) -> List[float]:
        a = self.arrivals
        return [b - x for x, b in zip(a, a[1:])]


def consume(pieces: Iterable[Any], rec: Request, t_sent_abs: float, t0: float) -> None:
    """Read a stream of pieces, recording when each arrived."""
    for _ in pieces:
        now = time.perf_counter()
        if rec.first is None:
            rec.first = now - t0
        rec.arrivals.append(now - t_sent_abs)


# audited sequences (audit) -------------------------------------------------

#: Sampler chains (specdec_cpu.audit.chains).
FIRST, LAST = "temperature-first", "temperature-last"


@dataclass(frozen=True)
class Job:
    """One sequence to generate: a prompt (templated text and its ids) and a seed."""

    index: int
    prompt: str  # prompt name
    text: str  # the chat-templated prompt, exactly what the engine is given
    ids: Tuple[int, ...]  # the text tokenized as every engine tokenizes it
    seed: int


@dataclass
class Sample:
    """One generated sequence: the ids sampled (EOG excluded) and what the engine said about it."""

    job: int
    prompt: str  # prompt name
    text: str  # templated prompt
    seed: int
    tokens: List[int]
    stopped: bool
    produced: int = 0  # ids the engine produced (before the cut at EOG / max_tokens)
    drafted: Optional[int] = None
    accepted: Optional[int] = None
    passes: Optional[int] = None  # target passes (ours)
    text_check: Optional[bool] = None  # tools: the parsed ids render the printed text exactly
    error: Optional[str] = None

    def record(self) -> Dict[str, Any]:
        """The audit's input format (one JSONL line)."""
        return {"prompt": self.text, "tokens": self.tokens, "stopped": self.stopped}

    def meta(self) -> List[Any]:
        return [getattr(self, f) if f != "tokens" else len(self.tokens) for f in META_FIELDS]


META_FIELDS = ["job", "prompt", "seed", "tokens", "stopped", "produced", "drafted", "accepted", "text_check"]


def cut(ids: Sequence[int], max_tokens: int, is_eog: Callable[[int], bool]) -> Tuple[List[int], bool]:
    """The ids up to the first EOG (stopped) or the first ``max_tokens`` ids (an unbiased stopping rule)."""
    for i, t in enumerate(ids[:max_tokens]):
        if is_eog(int(t)):
            return [int(x) for x in ids[:i]], True
    return [int(x) for x in ids[:max_tokens]], False


@dataclass
class Ctx:
    """What engines need: model files, threads, lengths, the target's tokenizer."""

    target: Path
    draft: Path
    threads: int
    parallel: int
    max_tokens: int
    tokenizer: Any  # specdec_cpu.engine.LlamaTokenizer of the target

    def is_eog(self, t: int) -> bool:
        return self.tokenizer.is_eog(t)

    def render(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.tokenizer.token_bytes(int(t)) for t in ids)


class Engine:
    """One engine, as the studies drive it (see the module docstring)."""

    id = "?"
    label = "?"
    alone = False  # serving: loaded only for its own runs, no other engine of its kind beside it
    chain = FIRST  # audit: the sampler chain the engine applies
    ids_from = "?"  # audit: where the sampled ids are read
    control = False  # audit: plain decoding
    batched = False  # audit: ``ctx.parallel`` sequences at once (else one)
    parallel = 1

    def start(self, k: int, threads: int) -> None:
        """Load for ``k`` concurrent sequences of ``threads`` threads."""
        raise NotImplementedError

    def stop(self) -> None:
        pass

    def request(self, prompt: str, setting: Any, max_tokens: int, seed: int, rec: Request,
                t0: float, ignore_eos: bool = False) -> None:
        """Serve one streamed request, filling ``rec`` (``ignore_eos``: run to ``max_tokens``)."""
        raise NotImplementedError

    def mark(self) -> None:
        """A run starts now (engines whose ``stats`` count from here)."""

    def stats(self) -> Dict[str, Any]:
        """Counters since the last call (engines that have them)."""
        return {}

    def start_audit(self, ctx: Ctx) -> None:
        """Start for the audit (``{parallel}`` in the label filled in)."""
        self.ctx = ctx
        self.parallel = ctx.parallel if self.batched else 1
        self.label = self.label.replace("{parallel}", str(self.parallel))
        self.start(self.parallel, ctx.threads)

    def run(self, jobs: List[Job], setting: Any) -> List[Sample]:
        """One Sample per job, in job order, ``parallel`` client threads at once."""
        if self.parallel == 1:
            return [self.one(job, setting) for job in jobs]
        with ThreadPoolExecutor(self.parallel) as pool:
            return list(pool.map(lambda job: self.one(job, setting), jobs))

    def one(self, job: Job, setting: Any) -> Sample:
        """Generate one audited sequence."""
        raise NotImplementedError

    def command(self) -> str:
        """How the audit ran the engine (one line for the report)."""
        return ""

"""llama-server as an engine: one process for the length of a ``with`` block (:func:`llama_server`),
one ``/completion`` request (:func:`server_complete`, whole or streamed), the suite's record
(:func:`run_server`) and the serving/audit adapter (:class:`LlamaServer`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ..common import quote
from . import base
from .base import N_CTX, Engine, Job, Sample, cut, free_port, pair_paths, shown, tool_env
from .llama_cli import SAMPLER_CHAIN, PathLike, PeerResult, PeerRunError, ensure_peers, sampling_args

HOST = "127.0.0.1"


class ServerURL(str):
    """The base URL ``http://127.0.0.1:PORT`` of a running server, with its ``command``, ``pid`` and
    :meth:`log_tail`."""

    command: List[str]
    pid: int
    _log: Any

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the server printed."""
        try:
            self._log.flush()
            with open(self._log.name, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
                data = f.read().decode("utf-8", "replace")
        except (OSError, ValueError, AttributeError):
            return ""
        return "\n".join(data.strip().splitlines()[-lines:])


def server_command(model: PathLike, *, port: int, draft: Optional[PathLike] = None, spec_type: Optional[str] = None,
                   draft_max: Optional[int] = None, draft_min: Optional[int] = None, parallel: int = 1,
                   ctx: int = 2048, threads: int = 2, seed: int = 1234, extra_args: Sequence[str] = ()) -> List[str]:
    """The ``llama-server`` command line (greedy by default: requests set their sampling); ``ctx`` is
    shared by the ``parallel`` slots."""
    t = str(int(threads))
    cmd = [str(ensure_peers()["server"]), "-m", os.fspath(model), "--host", HOST, "--port", str(int(port)),
           "-c", str(int(ctx)), "--parallel", str(int(parallel)), "-t", t, "-tb", t,
           *sampling_args(0.0, 0, 1.0, 0.0, seed), "--no-webui"]
    if draft is not None:
        cmd += ["-md", os.fspath(draft), "-td", t, "-tbd", t]
        spec_type = spec_type or "draft-simple"  # this revision does not speculate with -md alone
    if spec_type:
        cmd += ["--spec-type", spec_type]
    if draft_max is not None:
        cmd += ["--spec-draft-n-max", str(int(draft_max))]
    if draft_min is not None:
        cmd += ["--spec-draft-n-min", str(int(draft_min))]
    return cmd + [str(a) for a in extra_args]


@contextmanager
def llama_server(model: PathLike, *, startup_timeout: float = 180.0, **options: Any) -> Iterator[ServerURL]:
    """Run ``llama-server`` (``options``: those of :func:`server_command`) until the block ends; yields its URL.

    Ready when ``GET /health`` answers 200 (else :class:`PeerRunError` with the log's tail);
    stopped with SIGTERM, SIGKILL after 15 s.  Started from the main thread (the one the signal
    follows), it dies with its parent (PR_SET_PDEATHSIG).  A port taken between our probe and
    the server's bind is retried, three times.
    """
    preexec = _pdeathsig_preexec() if threading.current_thread() is threading.main_thread() else None
    last_error: Optional[BaseException] = None
    for _ in range(3):
        port = free_port()
        cmd = server_command(model, port=port, **options)
        log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=tool_env(), preexec_fn=preexec)
        try:
            url = ServerURL(f"http://{HOST}:{port}")
            url.command, url.pid, url._log = cmd, proc.pid, log
            try:
                base.wait_ready(proc, lambda: base.http_ok(url, "/health"), startup_timeout, lambda why: PeerRunError(
                    f"llama-server {why}: {' '.join(quote(c) for c in cmd)}\n{url.log_tail(30)}"))
            except PeerRunError as exc:
                if proc.poll() is not None and re.search(r"bind|address already in use", url.log_tail(40), re.I):
                    last_error = exc
                    continue
                raise
            yield url
            return
        finally:
            base.stop_process(proc, 15.0)
            log.close()
            with suppress(OSError):
                os.unlink(log.name)
    raise PeerRunError(f"llama-server could not bind a free port: {last_error}")


def _pdeathsig_preexec():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return lambda: libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG, in the child before exec


@dataclass
class ServerCompletion:
    """One ``/completion`` answer.  Rates are the server's decode-phase ``timings``
    (``tokens_per_s`` = (``n_predicted`` − 1) / ``predicted_ms``: the prompt pass excluded)."""

    text: str
    token_ids: List[int]  # generated ids (an ending EOG included)
    n_predicted: int  # timings.predicted_n
    predicted_ms: float
    tokens_per_s: float  # timings.predicted_per_second
    prompt_tokens: Optional[int]  # tokens_evaluated (the whole prompt)
    prompt_ms: Optional[float]
    draft_n: Optional[int]  # tokens drafted (absent when none)
    draft_n_accepted: Optional[int]
    stop_type: Optional[str]  # "eos", "limit", "word" or "none"
    wall_seconds: float  # request sent -> last byte, as the client saw it
    arrival_s: Optional[List[float]] = None  # streamed: each token's arrival, seconds after sending
    timings: Dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance(self) -> Optional[float]:
        return (self.draft_n_accepted or 0) / self.draft_n if self.draft_n else None

    @property
    def ttft_s(self) -> Optional[float]:
        return self.arrival_s[0] if self.arrival_s else None


def server_complete(url: str, prompt: Union[str, Sequence[int]], n_predict: int = 128, *, temperature: float = 0.0,
                    top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 1234, stream: bool = False,
                    cache_prompt: bool = True, extra: Optional[Dict[str, Any]] = None,
                    timeout: Optional[float] = 600.0, endpoint: str = "/completion") -> ServerCompletion:
    """One request, blocking and thread-safe: the raw prompt (text, special tokens parsed, or ids), our
    sampler chain only, token ids returned; ``extra`` adds or overrides fields (``endpoint="/infill"``
    takes its fields there).  ``stream=True`` records each token's arrival.  :class:`PeerRunError` on
    an HTTP error, an error event or no ``timings``."""
    body: Dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt], "n_predict": int(n_predict),
        "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "min_p": float(min_p),
        "seed": int(seed), "samplers": SAMPLER_CHAIN.split(";"), "stream": bool(stream), "return_tokens": True,
        "cache_prompt": bool(cache_prompt), **(extra or {})}
    stream = body["stream"]
    conn = http.client.HTTPConnection(url.split("://", 1)[-1].rstrip("/"), timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", endpoint, body=json.dumps(body).encode("utf-8"),
                     headers={"Content-Type": "application/json",
                              "Accept": "text/event-stream" if stream else "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise PeerRunError(f"llama-server {endpoint} answered {resp.status}: "
                               f"{resp.read()[:500].decode('utf-8', 'replace')}")
        if stream:
            ids, streamed, arrival, final = _read_stream(resp, t0)
        else:
            final = json.loads(resp.read())
            ids, streamed, arrival = [int(t) for t in final.get("tokens") or []], "", None
        wall = time.perf_counter() - t0
    except (OSError, http.client.HTTPException) as exc:
        raise PeerRunError(f"llama-server request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    tm = final.get("timings")
    if not tm:
        raise PeerRunError("llama-server's answer has no 'timings'")
    return ServerCompletion(
        text=streamed + final.get("content", ""), token_ids=ids,
        n_predicted=int(tm.get("predicted_n", final.get("tokens_predicted", 0))),
        predicted_ms=float(tm.get("predicted_ms", 0.0)), tokens_per_s=float(tm.get("predicted_per_second", 0.0)),
        prompt_tokens=final.get("tokens_evaluated"), prompt_ms=tm.get("prompt_ms"), draft_n=tm.get("draft_n"),
        draft_n_accepted=tm.get("draft_n_accepted"), stop_type=final.get("stop_type"), wall_seconds=wall,
        arrival_s=arrival, timings=dict(tm))


def _read_stream(resp: http.client.HTTPResponse, t0: float) -> Tuple[List[int], str, List[float], Dict[str, Any]]:
    """A server-sent event stream, read to its end: the ids, their text, when each id arrived
    (seconds after ``t0``) and the final (stop) event."""
    ids: List[int] = []
    pieces: List[str] = []
    arrival: List[float] = []
    final = None
    for line in iter(resp.readline, b""):
        line = line.strip()
        if line.startswith(b"error:"):
            raise PeerRunError(f"llama-server streamed an error: {line[6:].strip().decode('utf-8', 'replace')}")
        if not line.startswith(b"data:"):
            continue
        if line[5:].strip() == b"[DONE]":
            break
        event = json.loads(line[5:].strip())
        now = time.perf_counter() - t0
        if "error" in event:
            raise PeerRunError(f"llama-server streamed an error: {event['error']}")
        for i, tok in enumerate(event.get("tokens") or []):
            ids.append(int(tok))
            pieces.append(event.get("content", "") if i == 0 else "")
            arrival.append(now)
        if event.get("stop"):
            final = event
    if final is None:
        raise PeerRunError("llama-server's stream ended without a final (stop) event")
    return ids, "".join(pieces), arrival, final


def run_server(url: ServerURL, prompt: str, n_predict: int = 128, temp: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 1234, *, min_p: float = 0.0,
               timeout: Optional[float] = 1800.0) -> PeerResult:
    """One single-client request as a :class:`PeerResult` (arguments as :func:`run_plain`'s)."""
    r = server_complete(url, prompt, n_predict, temperature=temp, top_k=top_k, top_p=top_p,
                        min_p=min_p, seed=seed, timeout=timeout)
    drafted = r.draft_n is not None
    return PeerResult(
        list(url.command), r.wall_seconds, r.tokens_per_s, r.n_predicted, r.predicted_ms / 1e3,
        prompt_tokens=r.prompt_tokens, prompt_seconds=None if r.prompt_ms is None else r.prompt_ms / 1e3,
        n_drafted=r.draft_n if drafted else 0, n_accepted=r.draft_n_accepted if drafted else 0,
        acceptance=r.acceptance, target_perf=dict(r.timings), text=r.text)


def start_servers(stack: ExitStack, target: PathLike, draft: PathLike, draft_max: Sequence[int], *, ctx: int,
                  threads: int) -> Dict[str, ServerURL]:
    """``server-plain`` and one ``server-md{n}`` per draft length, single slot, stopped when ``stack`` closes."""
    servers = {"server-plain": stack.enter_context(llama_server(target, ctx=ctx, threads=threads))}
    for n in draft_max:
        servers[f"server-md{n}"] = stack.enter_context(llama_server(target, draft=draft, draft_max=n, ctx=ctx,
                                                                    threads=threads))
    return servers


class LlamaServer(Engine):
    """llama-server --parallel K, plain or with a draft model (-md)."""

    ids_from = "`tokens` of the `/completion` answer (`return_tokens`)"
    batched = True

    def __init__(self, draft_max: Optional[int] = None, *, id: Optional[str] = None, label: Optional[str] = None,
                 control: bool = False) -> None:
        self.draft_max, self.control = draft_max, control
        self.id = id or ("server-plain" if draft_max is None else f"server-md{draft_max}")
        self.label = label or ("llama-server --parallel K" if draft_max is None
                               else f"llama-server --parallel K -md (draft-n-max {draft_max})")
        self._stack: Optional[ExitStack] = None

    def start(self, k: int, threads: int) -> None:
        target, draft = pair_paths()
        md = self.draft_max is not None
        self._stack = ExitStack()
        self.url = self._stack.enter_context(llama_server(
            target, draft=draft if md else None, draft_max=self.draft_max, draft_min=0 if md else None,
            parallel=k, ctx=N_CTX * k, threads=threads, startup_timeout=600.0))

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False):
        t_sent = time.perf_counter()
        r = server_complete(self.url, prompt, max_tokens, temperature=setting.temperature,
                            top_k=setting.top_k, top_p=setting.top_p, min_p=setting.min_p, seed=seed,
                            stream=True, extra={"ignore_eos": True} if ignore_eos else None)
        rec.arrivals = list(r.arrival_s or [])
        if rec.arrivals:
            rec.first = (t_sent - t0) + rec.arrivals[0]
        rec.tokens = int(r.n_predicted)

    def one(self, job: Job, setting) -> Sample:
        r = server_complete(self.url, list(job.ids), self.ctx.max_tokens, temperature=setting.temperature,
                            top_k=setting.top_k, top_p=setting.top_p, min_p=setting.min_p, seed=job.seed,
                            cache_prompt=True, timeout=1800.0)
        tokens, stopped = cut(r.token_ids, self.ctx.max_tokens, self.ctx.is_eog)
        if r.stop_type == "eos" and not stopped:
            raise PeerRunError(f"job {job.index}: stop_type eos but no EOG id in the answer's tokens")
        return Sample(job.index, job.prompt, job.text, job.seed, tokens, stopped, produced=len(r.token_ids),
                      drafted=r.draft_n or 0, accepted=r.draft_n_accepted or 0)

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def command(self) -> str:
        return (shown(self.url.command, {"--port": "PORT"})
                + f"; POST /completion with the prompt's ids, n_predict {self.ctx.max_tokens}, temperature, top_k 0, "
                "top_p, min_p 0, seed, samplers [temperature, top_k, top_p, min_p], return_tokens true")

"""llama-server as an engine: one process for the length of a ``with`` block,
and its HTTP API as a client sees it.

llama-server (built with the other llama.cpp binaries, bench/engines/llama_cli.py)
batches ``--parallel`` slots continuously; it decodes speculatively with a
draft model (``-md`` with ``--spec-type draft-simple``) or draftless with its
n-gram ``--spec-type`` modes.  :func:`llama_server` runs one,
:func:`server_complete` sends it one ``/completion`` request (whole or
streamed, with per-token arrival times); :func:`run_server` is the suite's
record of one request, :class:`LlamaServer` the adapter of the serving study
and of the exactness audit.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .base import N_CTX, Engine, Job, Sample, cut, pair_paths, quote, short_paths
from .llama_cli import SAMPLER_CHAIN, PathLike, PeerResult, PeerRunError, ensure_peers, sampling_args

#: llama-server's speculative types that need no draft model (this llama.cpp
#: revision: common/speculative.cpp).  ``ngram-simple``: the m tokens after the
#: last earlier occurrence of the current n-gram; ``ngram-map-k``: the same
#: through a map of n-grams seen min-hits times; ``ngram-map-k4v``: up to four
#: continuations per key, the clearly most frequent one drafted (experimental);
#: ``ngram-mod``: a rolling-hash pool n-gram -> next token shared by all slots,
#: drafting token by token; ``ngram-cache``: llama.cpp's lookup decoding
#: (n-gram statistics of the context, 1- to 4-grams, 8 tokens per draft).
SERVER_NGRAM_TYPES: Tuple[str, ...] = (
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")

#: The sampler order of our engine, as the list a /completion request takes.
SERVER_SAMPLERS: List[str] = SAMPLER_CHAIN.split(";")


class ServerURL(str):
    """What :func:`llama_server` yields: the base URL (``http://127.0.0.1:PORT``).

    A ``str``, so ``url + "/completion"`` works; it also carries the server's
    ``command`` (list), ``pid``, ``port``, ``startup_seconds`` and
    :meth:`log_tail` (the last lines of the server's combined stdout/stderr).
    """

    command: List[str]
    pid: int
    port: int
    startup_seconds: float
    _log: Any

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the server printed (its log goes to a temporary file)."""
        return _file_tail(self._log, lines)

    @property
    def command_line(self) -> str:
        return " ".join(quote(c) for c in self.command)


def _file_tail(fh: Any, lines: int) -> str:
    try:
        fh.flush()
        with open(fh.name, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except (OSError, ValueError, AttributeError):
        return ""
    return "\n".join(data.strip().splitlines()[-lines:])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(
    model: PathLike,
    *,
    port: int,
    host: str = "127.0.0.1",
    draft: Optional[PathLike] = None,
    spec_type: Optional[Union[str, Sequence[str]]] = None,
    draft_max: Optional[int] = None,
    draft_min: Optional[int] = None,
    parallel: int = 1,
    ctx: int = 2048,
    threads: int = 2,
    threads_batch: Optional[int] = None,
    threads_draft: Optional[int] = None,
    threads_batch_draft: Optional[int] = None,
    kv_unified: Optional[bool] = None,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    extra_args: Sequence[str] = (),
    binary: Optional[PathLike] = None,
) -> List[str]:
    """The ``llama-server`` command line :func:`llama_server` runs (see there for the arguments)."""
    exe = Path(binary) if binary is not None else ensure_peers()["server"]
    t = int(threads)
    tb = int(threads_batch if threads_batch is not None else t)
    cmd = [
        str(exe), "-m", os.fspath(model), "--host", host, "--port", str(int(port)),
        "-c", str(int(ctx)), "--parallel", str(int(parallel)),
        "-t", str(t), "-tb", str(tb),
        *sampling_args(temp, top_k, top_p, min_p, seed),
        "--no-webui",
    ]
    if kv_unified is True:
        cmd.append("-kvu")
    elif kv_unified is False:
        cmd.append("-no-kvu")
    types = [spec_type] if isinstance(spec_type, str) else list(spec_type or [])
    if draft is not None:
        td = int(threads_draft if threads_draft is not None else t)
        tbd = int(threads_batch_draft if threads_batch_draft is not None else td)
        cmd += ["-md", os.fspath(draft), "-td", str(td), "-tbd", str(tbd)]
        if not types:
            # this revision enables no speculative implementation unless asked to
            # (a plain GGUF draft is not auto-detected): -md alone would not speculate
            types = ["draft-simple"]
    if types:
        cmd += ["--spec-type", ",".join(types)]
    if draft_max is not None:
        cmd += ["--spec-draft-n-max", str(int(draft_max))]
    if draft_min is not None:
        cmd += ["--spec-draft-n-min", str(int(draft_min))]
    cmd += [str(a) for a in extra_args]
    return cmd


def _http(method: str, url: str, path: str, body: Optional[dict] = None,
          timeout: Optional[float] = 600.0) -> Tuple[int, bytes]:
    """One HTTP request with the standard library; returns (status, body)."""
    host_port = url.split("://", 1)[-1].rstrip("/")
    conn = http.client.HTTPConnection(host_port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@contextmanager
def llama_server(model: PathLike, *, host: str = "127.0.0.1", startup_timeout: float = 180.0,
                 stop_timeout: float = 15.0, die_with_parent: Optional[bool] = None,
                 **options: Any) -> Iterator[ServerURL]:
    """Run ``llama-server`` for the length of a ``with`` block; yields its base URL.

    ::

        with llama_server(target, draft=draft, draft_max=8, parallel=4, ctx=4096) as url:
            r = server_complete(url, prompt, 128, temperature=1.0, seed=1)
            print(r.tokens_per_s, r.acceptance, url.log_tail(5))

    ``options`` are those of :func:`server_command`:

    - ``model``: the target GGUF.  ``draft``: a draft GGUF (``-md``); with a
      draft and no ``spec_type`` the server runs ``--spec-type draft-simple``
      (the draft proposes its greedy continuation, the target samples each
      position and keeps the draft token when it samples the same one).
    - ``spec_type``: llama-server's ``--spec-type``, one name or several (see
      :data:`SERVER_NGRAM_TYPES` for the draftless ones); ``None`` with no
      draft: plain decoding.  Mode-specific knobs
      (``--spec-ngram-simple-size-n`` ...) go in ``extra_args``.
    - ``draft_max`` / ``draft_min``: ``--spec-draft-n-max`` / ``--spec-draft-n-min``
      (the draft model's γ; the n-gram modes have their own lengths).
    - ``parallel``: ``--parallel`` slots (concurrent requests); ``ctx``: ``-c``,
      the whole context shared by the slots (each slot gets ``ctx / parallel``
      unless ``kv_unified``).  ``kv_unified``: ``-kvu`` (True), ``-no-kvu``
      (False) or the server's default (None).
    - ``threads`` / ``threads_batch`` / ``threads_draft`` /
      ``threads_batch_draft``: ``-t`` / ``-tb`` / ``-td`` / ``-tbd`` (each
      defaults to ``threads``).
    - ``temp``, ``top_k``, ``top_p``, ``min_p``, ``seed``: the server's
      default sampling, with the sampler chain of our engine
      (``--samplers temperature;top_k;top_p;min_p``); requests sent with
      :func:`server_complete` set them again anyway.
    - ``startup_timeout``: seconds to wait for ``GET /health`` to return 200
      (the models are loaded).  If the server exits or the time runs out,
      :class:`PeerRunError` is raised with the tail of its log.
    - ``die_with_parent``: ask Linux to SIGTERM the server if this process
      dies without cleaning up (``PR_SET_PDEATHSIG``).  The signal follows
      the *thread* that started the server, so the default (None) enables it
      only when called from the main thread.

    On leaving the block (normally or by an exception, KeyboardInterrupt
    included) the server gets SIGTERM, then SIGKILL after ``stop_timeout``
    seconds.  The server's output goes to a temporary file, removed at the
    end; :meth:`ServerURL.log_tail` reads it while the server runs.
    A busy port (the OS gave it to someone else between our probe and the
    server's bind) is retried with another port, three times.
    """
    if die_with_parent is None:
        die_with_parent = threading.current_thread() is threading.main_thread()
    preexec = _pdeathsig_preexec() if die_with_parent else None
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    last_error: Optional[BaseException] = None
    for attempt in range(3):
        port = free_port(host)
        cmd = server_command(model, port=port, host=host, **options)
        log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, preexec_fn=preexec)
        try:
            url = ServerURL(f"http://{host}:{port}")
            url.command, url.pid, url.port, url._log = cmd, proc.pid, port, log
            try:
                _wait_healthy(url, proc, startup_timeout)
            except PeerRunError as exc:
                tail = url.log_tail(40)
                if proc.poll() is not None and re.search(r"bind|address already in use", tail, re.I):
                    last_error = exc
                    continue  # someone took the port: try another one
                raise
            url.startup_seconds = time.perf_counter() - t0
            yield url
            return
        finally:
            _stop(proc, stop_timeout)
            log.close()
            try:
                os.unlink(log.name)
            except OSError:
                pass
    raise PeerRunError(f"llama-server could not bind a free port: {last_error}")


def _pdeathsig_preexec():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def preexec() -> None:  # runs in the child between fork and exec
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    return preexec


def _wait_healthy(url: ServerURL, proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        rc = proc.poll()
        if rc is not None:
            raise PeerRunError(f"llama-server exited with {rc} while starting: {url.command_line}\n"
                               f"{url.log_tail(30)}")
        try:
            status, _ = _http("GET", url, "/health", timeout=5.0)
            if status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise PeerRunError(f"llama-server did not report healthy within {timeout:.0f} s: "
                               f"{url.command_line}\n{url.log_tail(30)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _stop(proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


@dataclass
class ServerCompletion:
    """One ``/completion`` answer of llama-server, as :func:`server_complete` returns it.

    Rates are the server's own decode-phase figures (``timings`` of the
    response): ``tokens_per_s`` = ``predicted_per_second`` = (``n_predicted``
    − 1) / ``predicted_ms`` — the first token comes from the prompt pass and
    the clock starts when the prompt is done, so prompt processing is
    excluded, as in the other tools' decode figures.
    """

    text: str
    token_ids: List[int]  # the generated tokens (an end-of-generation token included if one ended it)
    n_predicted: int  # timings.predicted_n
    predicted_ms: float  # timings.predicted_ms
    tokens_per_s: float  # timings.predicted_per_second
    prompt_tokens: Optional[int]  # tokens_evaluated (the whole prompt)
    prompt_processed: Optional[int]  # timings.prompt_n (not taken from the slot's cache)
    prompt_ms: Optional[float]  # timings.prompt_ms
    cache_n: Optional[int]  # timings.cache_n (prompt tokens reused from the slot's cache)
    draft_n: Optional[int]  # timings.draft_n: tokens drafted (absent when nothing was drafted)
    draft_n_accepted: Optional[int]  # timings.draft_n_accepted
    stop_type: Optional[str]  # "eos", "limit", "word" or "none"
    truncated: bool
    wall_seconds: float  # request sent -> last byte received, as the client saw it
    id_slot: Optional[int] = None
    #: streaming only: the text each event carried (one per token; "" while a
    #: UTF-8 character is incomplete) and when it arrived, in seconds after
    #: the request was sent.
    pieces: Optional[List[str]] = None
    arrival_s: Optional[List[float]] = None
    timings: Dict[str, Any] = field(default_factory=dict)
    request: Dict[str, Any] = field(default_factory=dict, repr=False)
    response: Dict[str, Any] = field(default_factory=dict, repr=False)  # the final JSON object

    @property
    def acceptance(self) -> Optional[float]:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        if not self.draft_n:
            return None
        return (self.draft_n_accepted or 0) / self.draft_n

    @property
    def ttft_s(self) -> Optional[float]:
        """Time to first token (streaming): request sent -> first token event received."""
        return self.arrival_s[0] if self.arrival_s else None


def completion_request(
    prompt: Union[str, Sequence[int]],
    n_predict: int = 128,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    stream: bool = False,
    cache_prompt: bool = True,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The JSON body :func:`server_complete` posts to ``/completion``.

    The prompt goes in raw (a string is tokenized by the server with special
    tokens parsed, like the other tools' ``-p``; a list of ids is used as is).
    Sampling matches ours: the chain ``temperature, top_k, top_p, min_p``
    (``samplers``), with every other sampler of llama.cpp left out of the
    chain; ``top_k=0``, ``top_p=1``, ``min_p=0`` are off, ``temperature=0``
    is greedy.  ``return_tokens`` makes the answer carry the token ids.
    ``extra`` adds or overrides fields (``ignore_eos``, ``stop``,
    ``n_probs``, ``timings_per_token`` ...).
    """
    body: Dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        "n_predict": int(n_predict),
        "temperature": float(temperature),
        "top_k": int(top_k),
        "top_p": float(top_p),
        "min_p": float(min_p),
        "seed": int(seed),
        "samplers": list(SERVER_SAMPLERS),
        "stream": bool(stream),
        "return_tokens": True,
        "cache_prompt": bool(cache_prompt),
    }
    if extra:
        body.update(extra)
    return body


def server_complete(url: str, prompt: Union[str, Sequence[int]], n_predict: int = 128, *,
                    timeout: Optional[float] = 600.0, endpoint: str = "/completion",
                    **request: Any) -> ServerCompletion:
    """Send one ``/completion`` request to a llama-server at ``url`` and wait for the answer.

    ``request``: the keyword arguments of :func:`completion_request`; ``endpoint="/infill"``
    sends a fill-in-the-middle request (its ``input_prefix``,
    ``input_suffix`` and ``input_extra`` in ``extra``, the prompt empty).  ``stream=True`` reads
    the server-sent events as they come and records, for every token, its
    text piece and its arrival time (``pieces``, ``arrival_s``; ``ttft_s``
    is the first), for time-to-first-token and inter-token measurements; the
    final event carries the same ``timings`` as a whole answer.  Blocking and
    thread-safe (one HTTP connection per call, standard library only), so
    concurrent clients can each call it from their own thread.

    Raises :class:`PeerRunError` on an HTTP error status, an error event or a
    response without ``timings``.
    """
    body = completion_request(prompt, n_predict, **request)
    stream = body["stream"]
    host_port = url.split("://", 1)[-1].rstrip("/")
    conn = http.client.HTTPConnection(host_port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", endpoint, body=json.dumps(body).encode("utf-8"),
                     headers={"Content-Type": "application/json",
                              "Accept": "text/event-stream" if stream else "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise PeerRunError(f"llama-server {endpoint} answered {resp.status}: "
                               f"{resp.read()[:500].decode('utf-8', 'replace')}")
        if not stream:
            final = json.loads(resp.read())
            wall = time.perf_counter() - t0
            ids = [int(t) for t in final.get("tokens") or []]
            return _completion(final, body, wall, ids, None, None)
        ids: List[int] = []
        pieces: List[str] = []
        arrival: List[float] = []
        final = None
        for event in _sse_events(resp):
            now = time.perf_counter() - t0
            if "error" in event:
                raise PeerRunError(f"llama-server streamed an error: {event['error']}")
            toks = event.get("tokens") or []
            for i, tok in enumerate(toks):
                ids.append(int(tok))
                pieces.append(event.get("content", "") if i == 0 else "")
                arrival.append(now)
            if event.get("stop"):
                final = event
        wall = time.perf_counter() - t0
        if final is None:
            raise PeerRunError("llama-server's stream ended without a final (stop) event")
        return _completion(final, body, wall, ids, pieces, arrival)
    except (OSError, http.client.HTTPException) as exc:
        raise PeerRunError(f"llama-server request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def _sse_events(resp: "http.client.HTTPResponse") -> Iterator[Dict[str, Any]]:
    """The JSON objects of a server-sent event stream (``data: {...}`` lines),
    each yielded as soon as its line has arrived."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line or line.startswith(b":"):
            continue  # event separator or a ping comment
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            yield json.loads(payload)
        elif line.startswith(b"error:"):
            yield {"error": line[6:].strip().decode("utf-8", "replace")}


def _completion(final: Dict[str, Any], body: Dict[str, Any], wall: float, ids: List[int],
                pieces: Optional[List[str]], arrival: Optional[List[float]]) -> ServerCompletion:
    tm = final.get("timings")
    if not tm:
        raise PeerRunError("llama-server's answer has no 'timings'")
    text = final.get("content", "") if pieces is None else "".join(pieces) + final.get("content", "")
    return ServerCompletion(
        text=text,
        token_ids=ids,
        n_predicted=int(tm.get("predicted_n", final.get("tokens_predicted", 0))),
        predicted_ms=float(tm.get("predicted_ms", 0.0)),
        tokens_per_s=float(tm.get("predicted_per_second", 0.0)),
        prompt_tokens=final.get("tokens_evaluated"),
        prompt_processed=tm.get("prompt_n"),
        prompt_ms=tm.get("prompt_ms"),
        cache_n=tm.get("cache_n"),
        draft_n=tm.get("draft_n"),
        draft_n_accepted=tm.get("draft_n_accepted"),
        stop_type=final.get("stop_type"),
        truncated=bool(final.get("truncated", False)),
        wall_seconds=wall,
        id_slot=final.get("id_slot"),
        pieces=pieces,
        arrival_s=arrival,
        timings=dict(tm),
        request=body,
        response={k: v for k, v in final.items() if k != "generation_settings"},
    )


def run_server(url: str, prompt: str, n_predict: int = 128, temp: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 1234, *, min_p: float = 0.0,
               timeout: Optional[float] = 1800.0) -> PeerResult:
    """One single-client request to a running llama-server, as a :class:`PeerResult`
    (the suite's record of a peer run; the argument names match :func:`run_plain`)."""
    r = server_complete(url, prompt, n_predict, temperature=temp, top_k=top_k, top_p=top_p,
                        min_p=min_p, seed=seed, timeout=timeout)
    cmd = list(getattr(url, "command", []) or [])
    return PeerResult(
        tool="server",
        command=cmd,
        returncode=0,
        wall_seconds=r.wall_seconds,
        tokens_per_s=r.tokens_per_s,
        n_decoded=r.n_predicted,
        decode_seconds=r.predicted_ms / 1e3,
        prompt_tokens=r.prompt_tokens,
        prompt_seconds=None if r.prompt_ms is None else r.prompt_ms / 1e3,
        n_drafted=r.draft_n if r.draft_n is not None else 0,
        n_accepted=r.draft_n_accepted if r.draft_n is not None else 0,
        acceptance=r.acceptance,
        target_perf=dict(r.timings),
        text=r.text,
    )


def start_servers(stack: ExitStack, target: PathLike, draft: PathLike, draft_max: Sequence[int], *, ctx: int,
                  threads: int) -> Dict[str, "ServerURL"]:
    """``server-plain`` and one ``server-md{n}`` per draft length, single slot,
    each stopped when ``stack`` closes."""
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
        self._stack = ExitStack()
        self.url = self._stack.enter_context(llama_server(
            target, draft=draft if self.draft_max is not None else None, draft_max=self.draft_max,
            draft_min=0 if self.draft_max is not None else None, parallel=k, ctx=N_CTX * k, threads=threads,
            startup_timeout=600.0))

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False):
        t_sent = time.perf_counter()
        r = server_complete(self.url, prompt, max_tokens, temperature=setting.temperature,
                            top_k=setting.top_k, top_p=setting.top_p, min_p=setting.min_p, seed=seed,
                            stream=True, extra={"ignore_eos": True} if ignore_eos else None)
        arrivals = r.arrival_s or []
        rec.arrivals = list(arrivals)
        if arrivals:
            rec.first = (t_sent - t0) + arrivals[0]
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
        cmd = list(self.url.command)
        port = cmd.index("--port")
        cmd[port + 1] = "PORT"
        return (" ".join(short_paths(quote(c)) for c in cmd)
                + f"; POST /completion with the prompt's ids, n_predict {self.ctx.max_tokens}, temperature, "
                "top_k 0, top_p, min_p 0, seed, samplers [temperature, top_k, top_p, min_p], "
                "return_tokens true")

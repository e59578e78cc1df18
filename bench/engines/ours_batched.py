"""Ours, batched: ``BatchedDecoder`` called directly (:class:`OursBatched`, serving and audit),
or a server process driven with the ``openai`` client (:class:`OpenAIServer`: ``specdec-cpu
serve``, optionally through Ray Serve)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..common import BENCH
from .base import N_CTX, Engine, consume, free_port, http_ok, pair_paths, stop_process, wait_ready
from .ours_single import OursEngine


class OursBatched(OursEngine):
    """BatchedDecoder: K sequences share every target pass (γ auto, or fixed; 0: continuous batching alone)."""

    batched = True

    def __init__(self, gamma: Any = "auto", draft_vocab: Optional[int] = None, *, draft: bool = True,
                 ngram: bool = False, control: bool = False, id: Optional[str] = None,
                 label: Optional[str] = None) -> None:
        super().__init__(gamma, draft, ngram)
        self.draft_vocab, self.control = draft_vocab, control
        self.id = id or ("batched-auto" if gamma == "auto" else f"batched-g{gamma}") + ("-cut" if draft_vocab else "")
        self.label = label or (f"ours, BatchedDecoder γ={gamma}"
                               + (f", draft cut to {draft_vocab} ids" if draft_vocab else ""))
        self.trace_path: Optional[Path] = None  # JSON lines of the decoder's steps (--trace-steps)
        self._trace = None
        self._run = 0

    def start(self, k: int, threads: int) -> None:
        from specdec_cpu import BatchedDecoder

        self._k = k
        if self.trace_path is not None:
            self._trace = open(self.trace_path, "a")
        self.dec = self.load(BatchedDecoder, threads, max_sequences=k, n_ctx=N_CTX, draft_vocab=self.draft_vocab,
                             step_trace=self._write_step if self._trace else None)
        self._last = self.dec.metrics()

    def _write_step(self, record) -> None:
        self._trace.write(json.dumps({"k": self._k, "run": self._run, **record.to_dict()}) + "\n")

    def mark(self) -> None:
        self._run += 1

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False):
        gen = super().request(prompt, setting, max_tokens, seed, rec, t0, ignore_eos)
        rec.decoder_ttft = gen.stats.first_token_seconds

    def stats(self) -> Dict[str, Any]:
        m = self.dec.metrics()
        last, self._last = self._last, m
        times = ("target_seconds", "draft_seconds", "sampling_seconds", "scheduler_seconds", "step_seconds")
        counts = ("target_passes", "target_rows", "tokens_generated", "drafted", "accepted", "alpha_rows", "alpha_sum")
        d = {k: getattr(m, k) - getattr(last, k) for k in counts + times}

        def per(a: str, b: str) -> Optional[float]:
            return d[a] / d[b] if d[b] else None

        return {"target_passes": d["target_passes"], "rows_per_pass": per("target_rows", "target_passes"),
                "tokens_per_pass": per("tokens_generated", "target_passes"), "drafted": d["drafted"],
                "acceptance": per("accepted", "drafted"), "mean_alpha": per("alpha_sum", "alpha_rows"),
                **{k.replace("seconds", "s"): d[k] for k in times}}

    def stop(self) -> None:
        super().stop()
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    def command(self) -> str:
        return (f"BatchedDecoder.from_gguf(F32, {'Q4_0' if self.use_draft else 'None'}, ngram={self.ngram}, "
                f"gamma={self.gamma!r}, max_sequences={self.parallel}, n_ctx={N_CTX}, n_threads={self.ctx.threads}), "
                f"{self.parallel} client threads calling .generate(prompt_ids, max_tokens={self.ctx.max_tokens}, "
                "params=SamplingParams(temperature, top_p, seed))")


def _thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds (user + system) of thread ``tid`` of process ``pid`` (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _raylet_running() -> bool:
    """Whether a Ray raylet runs on this host."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):  # gone meanwhile
            if Path(f"/proc/{pid}/comm").read_text(errors="replace").strip() == "raylet":
                return True
    return False


class OpenAIServer(Engine):
    """Serving: a server process (ours, ``specdec-cpu serve``, optionally through Ray; or a
    subclass's) fed streamed /v1/completions by the ``openai`` client.  ``python``: the
    interpreter running it (the previous main's for ``ours-baseline``)."""

    health = "/health"

    def __init__(self, id: str, label: str, kind: str = "ours", *, replicas: int = 0, threads: Optional[int] = None,
                 python: Optional[str] = None) -> None:
        self.id, self.label, self.kind = id, label, kind
        self.python = python or sys.executable
        self.replicas, self.fixed_threads = replicas, threads
        self.proc = None
        self.alone = bool(replicas)  # an idle Ray cluster's processes would take CPU from the other's runs
        self.ingress: Optional[str] = None

    def _command(self, k: int, threads: int, port: int) -> List[str]:
        target, draft = pair_paths()
        cmd = [self.python, "-m", "specdec_cpu.cli", "serve", target, draft, "--port", str(port),
               "--threads", str(threads), "--n-ctx", str(N_CTX), "--max-sequences", str(k),
               "--model-name", "bench", "--log-level", "warning"]
        return cmd + (["--ray", "--replicas", str(self.replicas)] if self.replicas else [])

    def start(self, k, threads):
        import openai

        if self.replicas:  # the last Ray cluster may still be ending: not on our cores
            end = time.monotonic() + 60
            while _raylet_running() and time.monotonic() < end:
                time.sleep(0.5)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(BENCH / f".serving-{self.id}.log", "w")
        self.proc = subprocess.Popen(self._command(k, self.fixed_threads or threads, port), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_ready(self.proc, lambda: http_ok(self.url, self.health, timeout=2), 600,
                   lambda why: RuntimeError(f"{self.id} {why}; see {self.log.name}"))
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="bench", max_retries=0, timeout=900)
        if self.replicas:  # which ingress took HTTP: the serving line, printed just after /health answers
            end, log = time.monotonic() + 60, ""
            while "through Ray Serve on" not in log and time.monotonic() < end:
                log = Path(self.log.name).read_text(errors="replace")
                time.sleep(0.2)
            self.ingress = ("haproxy" if "HAProxy ingress" in log else
                            "python-proxy" if "Python proxy" in log else "unknown")

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False):
        t_sent = time.perf_counter()
        stream = self.client.completions.create(
            model="bench", prompt=prompt, max_tokens=max_tokens, temperature=setting.temperature,
            top_p=setting.top_p, seed=seed, stream=True, stream_options={"include_usage": True},
            extra_body={"top_k": setting.top_k, "min_p": setting.min_p, **self._ban_eos(ignore_eos)})
        usage: List[int] = []

        def texts():
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    yield chunk
                if chunk.usage is not None:
                    usage.append(chunk.usage.completion_tokens)

        consume(texts(), rec, t_sent, t0)
        rec.tokens = (usage[-1] if usage else 0) or len(rec.arrivals)

    def mark(self) -> None:
        measured = self.kind == "ours" and not self.replicas and Path(f"/proc/{self.proc.pid}/task").is_dir()
        self._mark = self._counters(scrape_first=True) if measured else None

    def stats(self) -> Dict[str, Any]:
        """Our server's CPU during the run (its event loop, i.e. the main thread, and the whole
        process) and decoder steps; through Ray, the ingress that took HTTP."""
        if self.replicas:
            return {"ingress": self.ingress}
        if getattr(self, "_mark", None) is None:
            return {}
        loop, proc, steps = (b - a for a, b in zip(self._mark, self._counters(scrape_first=False)))
        return {"server_loop_cpu_s": loop, "server_cpu_s": proc, "steps": steps}

    def _counters(self, scrape_first: bool) -> tuple:
        """(event-loop CPU s, process CPU s, decoder steps), the /metrics scrape outside the measured span."""
        def steps() -> float:
            return self._metric_samples("specdec_steps")["specdec_steps_total"]

        first = steps() if scrape_first else None
        pid = self.proc.pid
        loop = _thread_cpu(pid, pid)
        proc = sum(_thread_cpu(pid, int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir())
        return loop, proc, first if scrape_first else steps()

    def decoder_ttft_total(self) -> tuple[float, int]:
        """The sum of the decoder's times to first token and their count so far (``/metrics``, all replicas)."""
        samples = self._metric_samples("specdec_time_to_first_token_seconds")
        return (samples.get("specdec_time_to_first_token_seconds_sum", 0.0),
                int(samples.get("specdec_time_to_first_token_seconds_count", 0)))

    def _metric_samples(self, family: str) -> Dict[str, float]:
        """One family of ``/metrics``: each sample name's value summed over label sets."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        out: Dict[str, float] = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=10).text):
            if fam.name == family:
                for sample in fam.samples:
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    def _ban_eos(self, ignore_eos: bool) -> Dict[str, Any]:
        return {"ignore_eos": True} if ignore_eos else {}

    def stop(self):
        stop_process(self.proc, 120)
        self.proc = None

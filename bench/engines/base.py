"""What the engine adapters share: the one interface the studies drive them
through, and what goes in and comes out of it.

An :class:`Engine` is started for K sequences at once (``start(k, threads)``)
and then serves

- streamed requests, one per client thread (bench/serving.py,
  bench/layer_latency.py): ``request`` fills a :class:`Request` with what the
  client saw (arrival of every piece, tokens);
- or whole sequences whose sampled token ids the exactness audit scores
  (bench/audit.py): ``start_audit(ctx)`` with a :class:`Ctx`, then
  ``run(jobs, setting)`` returns one :class:`Sample` per :class:`Job`.

An engine implements what its studies use; the rest raises NotImplementedError.
"""

from __future__ import annotations

import dataclasses
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

#: Tokens of context per sequence in the serving and audit studies (a prompt of
#: up to ~520 tokens and the new tokens fit).
N_CTX = 1024


def quote(s: str) -> str:
    """``s`` as a shell word."""
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def short_paths(text: str) -> str:
    """``text`` with the package's cache directory written ``<cache>`` (no machine paths in results)."""
    from specdec_cpu.paths import cache_dir

    return text.replace(str(cache_dir()), "<cache>")


def pair_paths() -> Tuple[str, str]:
    """The demo pair's files: the F32 target and the Q4_0 draft (downloaded once)."""
    from specdec_cpu.demo_models import ensure_model

    from ..suite import F32, Q4_0

    return str(ensure_model(F32)), str(ensure_model(Q4_0))


# ---------------------------------------------------------------------------
# streamed requests (serving)
# ---------------------------------------------------------------------------


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
    #: ours called directly: the decoder's own time to first token (submission → first token)
    decoder_ttft: Optional[float] = None

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


def params(setting: Any, seed: int, ignore_eos: bool) -> Any:
    """The setting's SamplingParams, end-of-generation tokens banned or not."""
    return dataclasses.replace(setting.params(seed), ignore_eos=ignore_eos)


# ---------------------------------------------------------------------------
# audited sequences (audit)
# ---------------------------------------------------------------------------

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
        return [self.job, self.prompt, self.seed, len(self.tokens), self.stopped, self.produced,
                self.drafted, self.accepted, self.text_check]


META_FIELDS = ["job", "prompt", "seed", "tokens", "stopped", "produced", "drafted", "accepted", "text_check"]


def cut(ids: Sequence[int], max_tokens: int, is_eog: Callable[[int], bool]) -> Tuple[List[int], bool]:
    """The ids up to the first EOG (stopped) or the first ``max_tokens`` ids.

    Cutting at a fixed length or at the first EOG depends on nothing after
    it, so every kept position is still a draw from the engine's law.
    """
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
    #: serving: loaded only for its own runs (started before each, stopped
    #: after), so that no other engine of its kind is loaded beside it
    alone = False
    #: audit: the sampler chain the engine applies, where the ids come from,
    #: whether it is a control (plain decoding)
    chain = FIRST
    ids_from = "?"
    control = False
    #: audit: generates ``ctx.parallel`` sequences at once (else one)
    batched = False
    parallel = 1

    def start(self, k: int, threads: int) -> None:
        """Load for ``k`` concurrent sequences of ``threads`` threads."""
        raise NotImplementedError

    def stop(self) -> None:
        pass

    # serving ---------------------------------------------------------------

    def request(self, prompt: str, setting: Any, max_tokens: int, seed: int, rec: Request,
                t0: float, ignore_eos: bool = False) -> None:
        """Serve one request, filling ``rec``; ``ignore_eos``: end-of-generation
        tokens banned, so that the answer runs to ``max_tokens``."""
        raise NotImplementedError

    def mark(self) -> None:
        """A run starts now (engines whose ``stats`` count from here)."""

    def stats(self) -> Dict[str, Any]:
        """Counters since the last call (engines that have them)."""
        return {}

    # audit -----------------------------------------------------------------

    def start_audit(self, ctx: Ctx) -> None:
        """Start for the audit: ``ctx.parallel`` sequences at once if ``batched``
        (its ``{parallel}`` filled into the label), else one."""
        self.ctx = ctx
        self.parallel = ctx.parallel if self.batched else 1
        self.label = self.label.replace("{parallel}", str(self.parallel))
        self.start(self.parallel, ctx.threads)

    def run(self, jobs: List[Job], setting: Any) -> List[Sample]:
        """One Sample per job, in job order: ``parallel`` jobs at once (one client thread each)."""
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

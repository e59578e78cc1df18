"""One generation as the step core sees it: its tokens, settings, random
streams, text and statistics.

Token bookkeeping: once its prompt is in, the target's cache holds every
token of ``seq`` but the last one, whose logits come with the next step's
rows.  A front (``SpeculativeDecoder``, ``BatchedDecoder``) makes one per
call and reads what it produced: text pieces as they come
(:meth:`Sequence.deliver`, overridden by a front that hands them to another
thread), and the :class:`~.stats.Generation` once it has finished.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Union
from typing import Sequence as Seq

import numpy as np

from .. import sampling
from ..errors import DecoderClosedError
from ..params import SamplingParams
from ..sampling import Rng
from .stats import Generation, GenerationStats
from .text import TextAssembler

if TYPE_CHECKING:
    from ..drafters.ngram import NgramDrafter
    from .penalties import Penalties

__all__ = ["GammaSetting", "SeedSequence", "Sequence", "choice_seed"]

GammaSetting = Union[int, str]
_ids = itertools.count(1)


def _splitmix64(z: int) -> int:
    z %= 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def choice_seed(seed: int, i: int) -> int:
    """The seed of choice ``i`` of a request seeded with ``seed`` (OpenAI's
    ``n``): SplitMix64 of both, so the choices' streams differ."""
    return _splitmix64(seed + 0x9E3779B97F4A7C15 * (i + 1) + 0xD1B54A32D192ED03)


class SeedSequence:
    """The seeds of a decoder's requests that bring none of their own: the
    n-th is SplitMix64 of (decoder seed, n), so a seeded decoder given the
    same requests in the same order draws the same numbers.  Thread-safe."""

    def __init__(self, seed: Optional[int]) -> None:
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed)
        self._n = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._n += 1
            n = self._n
        return _splitmix64(self.seed + 0x9E3779B97F4A7C15 * n)


class Sequence:
    """The state of one generation.

    Attributes set by the front: ``prompt`` (token ids), ``max_tokens``,
    ``params``, ``text`` (stop strings), ``gamma`` (a fixed γ, 0 or
    ``"auto"``), the two random streams, ``cancel``/``timeout``.  Set while
    it runs: ``slot`` (its sequence in the models' caches), ``seq`` (prompt
    and output so far), ``out``, ``stats``, ``ngram`` (its prompt-lookup
    drafter, if any), ``constraint`` (the grammar its output follows, at
    the accepted output: ``ConstraintState``), ``penalties`` (its
    penalties and biases: ``core.penalties.Penalties``), ``logprobs`` (how
    many alternatives to report per token, None for no log-probabilities,
    of the ``logprob_mode`` distribution) and ``token_logprobs`` (one
    entry per output token), ``prompt_logprobs`` (alternatives per prompt
    token, None for none) and ``prompt_entries`` (one per prompt token
    after the first, filled as the prompt goes in), ``plan`` (the draft policy's estimates for it).
    """

    def __init__(self, prompt: list[int], *, max_tokens: int, params: SamplingParams, text: TextAssembler,
                 gamma: GammaSetting, n_vocab: int, seed: Optional[int] = None,
                 cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
                 gamma_rows: int = 16) -> None:
        self.id = next(_ids)
        self.prompt = prompt
        self.seq: list[int] = list(prompt)
        self.out: list[int] = []
        self.max_tokens, self.params, self.text, self.gamma = max_tokens, params, text, gamma
        self.cancel = cancel
        self.submitted = time.perf_counter()
        self.deadline = None if timeout is None else self.submitted + timeout
        self.rng_draft: Optional[Rng] = None
        self.rng_verify: Optional[Rng] = None
        if seed is not None:
            self.set_seed(seed)
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.slot: Optional[int] = None
        self.admitted: Optional[float] = None
        self.prefilled = False
        self.finished = False
        self.closed = False  # the caller went away (a closed or dropped stream)
        self.ngram: Optional["NgramDrafter"] = None
        #: the grammar the output must follow (a ConstraintState: constraints/state.py), if any
        self.constraint: Any = None
        #: (token, ConstraintState): a grammar that becomes ``constraint`` once the output emits ``token``
        self.trigger: Optional[tuple[int, Any]] = None
        self.penalties: Optional["Penalties"] = None
        self.logprobs: Optional[int] = None
        self.logprob_mode = "model"
        self.token_logprobs: list = []  # TokenLogprob per output token, when logprobs is set
        self.end_logprob: Any = None  # the TokenLogprob of the end token that stopped it, when logprobs is set
        self.prompt_logprobs: Optional[int] = None
        self.prompt_entries: list = []  # TokenLogprob per prompt token after the first, when prompt_logprobs is set
        self.plan: Any = None  # the draft policy's per-sequence state (planning/policy.py)
        #: a sequence whose prompt this one waits for, to share its cached cells (n choices)
        self.after: Optional["Sequence"] = None
        self.result: Optional[Generation] = None
        self.error: Optional[BaseException] = None
        self.pieces: list[str] = []  # text delivered and not yet taken (see take_pieces)
        self._q: Optional[np.ndarray] = None  # q rows of model drafts, allocated on first use
        self._masks: Optional[np.ndarray] = None  # a constraint's mask rows, allocated on first use
        self._q_rows = gamma_rows
        self._n_vocab = n_vocab

    def set_seed(self, seed: int) -> None:
        """Start the sequence's random streams (drafting, verification) from ``seed``."""
        self.rng_draft = sampling.Rng(seed, sampling.DRAFT_STREAM)
        self.rng_verify = sampling.Rng(seed, sampling.VERIFY_STREAM)

    # ------------------------------------------------------------ the core's side
    @property
    def held_slot(self) -> int:
        """``slot``, for a sequence that holds one (the loop's active sequences)."""
        assert self.slot is not None, f"request {self.id} holds no slot"
        return self.slot

    def q_rows(self, gamma: int) -> np.ndarray:
        """A ``(≥ gamma, V)`` float32 buffer for the q rows of a model draft."""
        if self._q is None or self._q.shape[0] < gamma:
            self._q = np.zeros((max(gamma, self._q_rows), self._n_vocab), dtype=np.float32)
        return self._q

    def mask_rows(self, rows: int) -> np.ndarray:
        """A ``(≥ rows, ceil(V/32))`` uint32 buffer for a step's mask rows."""
        if self._masks is None or self._masks.shape[0] < rows:
            self._masks = np.zeros((max(rows, self._q_rows + 1), (self._n_vocab + 31) // 32), dtype=np.uint32)
        return self._masks

    def changes(self, draft: "Seq[int] | np.ndarray", k: int, first: int = 0,
                masks: Optional[np.ndarray] = None) -> sampling.Changes:
        """The changes of rows ``first .. first + k - 1`` of a step whose
        draft is ``draft`` (row j continues the output and ``draft[:j]``):
        the grammar's mask rows (``masks``, filled by the core) and the
        penalties' sparse rows."""
        mask = None if masks is None else masks[first:first + k]
        sparse = None if self.penalties is None else self.penalties.rows(draft, k, first, mask)
        if mask is None and sparse is None:
            return sampling.NO_CHANGES
        return sampling.Changes(mask, sparse)

    @property
    def scored(self) -> bool:
        """Asked for nothing but its prompt's log-probabilities (``max_tokens``
        0), and they are all in: it ends without sampling."""
        return self.max_tokens == 0 and len(self.prompt_entries) == len(self.prompt) - 1

    def room(self, n_ctx: int) -> int:
        """Draft tokens a step may still propose: one token is always emitted
        after them, within ``max_tokens`` and the context."""
        return max(0, min(self.max_tokens - self.stats.tokens - 1, n_ctx - len(self.seq)))

    def stop_reason(self, now: float) -> Optional[str]:
        """``"cancelled"`` or ``"timeout"`` once the generation must stop."""
        if self.closed or self._cancel_set():
            return "cancelled"
        if self.deadline is not None and now >= self.deadline:
            return "timeout"
        return None

    def _cancel_set(self) -> bool:
        if self.cancel is None:
            return False
        try:
            return bool(self.cancel.is_set())
        except Exception:  # a cancel event that fails (a Manager().Event() whose manager is gone):
            return True    # this request stops, the decoder's thread and the others go on

    def deliver(self, piece: str) -> None:
        """A text piece is ready for the caller."""
        if piece:
            self.pieces.append(piece)

    def ring(self) -> None:
        """The step that delivered pieces has ended (a front waking a reader overrides it)."""

    def take_pieces(self) -> list[str]:
        """The pieces delivered since the last call."""
        pieces, self.pieces = self.pieces, []
        return pieces

    def finish(self, reason: Optional[str], error: Optional[BaseException] = None) -> None:
        """End the generation: flush held-back text, record why, build the result."""
        if self.finished:
            return
        self.finished = True
        stats = self.stats
        if stats.finish_reason is None:
            stats.finish_reason = reason or "cancelled"
        if error is None and stats.finish_reason in ("stop", "length", "context"):
            self.deliver(self.text.finish())
        if self.admitted is not None:
            stats.total_seconds = time.perf_counter() - self.admitted
            if not self.prefilled:  # ended while taking in its prompt: all of it was prompt time
                stats.prompt_seconds = stats.total_seconds
        self.result = Generation(self.text.text, self.out, stats,
                                 self.token_logprobs[:len(self.out)] if self.logprobs is not None else None,
                                 list(self.prompt_entries) if self.prompt_logprobs is not None else None,
                                 self.end_logprob)
        if isinstance(error, DecoderClosedError) and error.partial is None:
            error.partial = self.result  # before the caller wakes to raise it
        self.error = error

"""The target model's logits along generated sequences, through llama.cpp.

For a sequence of prompt ids P and emitted ids E, the row predicting E[i]
comes from the position of (P + E)[len(P) − 1 + i].  One ``llama_decode``
over P + E (the prompt part without outputs, up to ``n_batch`` rows with
outputs per pass) yields all of them; a stopped sequence needs one row more,
the one after its last emitted token, where the EOG outcome was drawn.
Consecutive sequences reuse the cached common prefix (e.g. the same prompt).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .samples import AuditInputError, GeneratedSequence

if TYPE_CHECKING:
    from ..constraints import Grammar
    from ..constraints.compiled import CompiledGrammar
    from ..constraints.grammar import SchemaInput
    from ..engine import LlamaContext, LlamaWeights

__all__ = ["TargetModel", "DEFAULT_N_BATCH"]

#: Rows per pass: the logits buffer holds n_batch × n_vocab floats
#: (150 MB at a 152k vocabulary), so larger sequences take several passes.
DEFAULT_N_BATCH = 256


class TargetModel:
    """A target GGUF model opened for auditing: tokenizer, EOG ids and logits rows.

    ``flash_attn`` and ``kv_type`` are passed to the llama.cpp context (see
    ``engine.LlamaContext``); the defaults match the decoder's.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, n_batch: int = DEFAULT_N_BATCH,
                 n_threads: Optional[int] = None, flash_attn: bool = False, kv_type: str = "f16",
                 weights: Optional[LlamaWeights] = None) -> None:
        from .. import engine  # the only door to llama.cpp

        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise ValueError(f"n_batch must be an int >= 1, got {n_batch!r}")
        self._own = weights is None
        self.weights = engine.LlamaWeights(path) if weights is None else weights
        self.tokenizer = engine.LlamaTokenizer(self.weights)
        self.n_vocab = self.weights.n_vocab
        self.n_batch = n_batch
        self.n_threads = n_threads
        self.flash_attn = flash_attn
        self.kv_type = kv_type
        self._ctx: Optional[LlamaContext] = None
        eog = sorted(self.tokenizer.eog_ids)
        self.eog_ids: List[int] = eog

    @property
    def path(self) -> str:
        return self.weights.path

    def compiled_grammar(self, grammar: Union[Grammar, SchemaInput]) -> CompiledGrammar:
        """``grammar`` (a ``constraints.Grammar``, or a JSON schema) compiled
        for this model's vocabulary (``InvalidGrammarError`` if it cannot be)."""
        from .. import engine
        from ..constraints import Grammar, compile_grammar

        if not isinstance(grammar, Grammar):
            grammar = Grammar.json_schema(grammar)
        return compile_grammar(grammar, engine.llg_tokenizer(self.weights), param="grammar")

    # -- ids -------------------------------------------------------------

    def prompt_ids(self, seq: GeneratedSequence) -> List[int]:
        """The prompt as the engine saw it: tokenized with BOS (when the model
        adds one) and special tokens parsed, or the given ids, range-checked."""
        if isinstance(seq.prompt, str):
            ids = self.tokenizer.tokenize(seq.prompt, add_special=True, parse_special=True)
            if not ids:
                raise AuditInputError(f"{_where(seq)}the prompt tokenizes to nothing")
            return ids
        return self._checked(list(seq.prompt), "prompt", seq)

    def emitted_ids(self, seq: GeneratedSequence) -> List[int]:
        """The emitted ids, or the emitted text tokenized without BOS."""
        if seq.tokens is not None:
            return self._checked(list(seq.tokens), "tokens", seq)
        return self.tokenizer.tokenize(seq.text or "", add_special=False, parse_special=True) if seq.text else []

    def _checked(self, ids: List[int], key: str, seq: GeneratedSequence) -> List[int]:
        for i, t in enumerate(ids):
            if not 0 <= t < self.n_vocab:
                raise AuditInputError(f"{_where(seq)}'{key}'[{i}] = {t} is outside the target's vocabulary "
                                      f"[0, {self.n_vocab})")
        return ids

    # -- logits ----------------------------------------------------------

    def rows(self, prompt: Sequence[int], emitted: Sequence[int], stopped: bool,
             n_ctx: int) -> Iterator[Tuple[int, np.ndarray]]:
        """``(first, logits)`` blocks: ``logits[j]`` is the row predicting
        outcome ``first + j`` (emitted[first + j], or the EOG outcome after
        the last emitted token when ``stopped``).  A block is a view valid
        until the next one is produced."""
        feed = list(prompt) + list(emitted)
        n_rows = len(emitted) + (1 if stopped else 0)
        if n_rows == 0:
            return
        if not stopped:
            feed = feed[:-1]  # the last emitted token predicts nothing audited
        ctx = self._context(n_ctx)
        first_row = len(feed) - n_rows  # feed index whose row predicts outcome 0
        keep = min(ctx.common_prefix(feed), first_row)
        if keep < ctx.n_past:
            ctx.truncate(keep)
        if first_row > keep:
            ctx.eval(feed[keep:first_row], 0)
        for start in range(first_row, len(feed), ctx.n_batch):
            chunk = feed[start:start + ctx.n_batch]
            yield start - first_row, ctx.eval(chunk, len(chunk))

    def _context(self, n_ctx: int):
        """A context holding at least ``n_ctx`` tokens (re-created when too small)."""
        if self._ctx is not None and self._ctx.n_ctx >= n_ctx:
            return self._ctx
        if self._ctx is not None:
            self._ctx.close()
        size = max(256, -(-n_ctx // 256) * 256)
        from ..engine import LlamaContext

        self._ctx = LlamaContext(self.weights, n_ctx=size, n_batch=min(self.n_batch, size),
                                 n_threads=self.n_threads, flash_attn=self.flash_attn, kv_type=self.kv_type)
        return self._ctx

    def close(self) -> None:
        """Free the context (and the weights, when this object loaded them)."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._own:
            self.weights.close()

    def __enter__(self) -> "TargetModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _where(seq: GeneratedSequence) -> str:
    return f"{seq.source}: " if seq.source else ""

"""Tiny numpy language models implementing the decoder's model protocols.

A ``MarkovLM`` has logits that depend on the last ``order`` tokens through a
random table, so the joint distribution of any short continuation is known in
closed form.  The decoder cannot tell it from a real model: it has a cache
that can be extended and truncated and returns fresh logits rows.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np


class MarkovLM:
    """logits(next | context) = table[last `order` tokens].

    ``pass_seconds`` makes every ``eval`` take at least that long, whatever
    the number of rows: a memory-bound model, so that a γ controller timing
    the passes sees a stable, flat cost curve instead of microsecond noise.
    """

    def __init__(self, n_vocab: int, *, order: int = 1, seed: int = 0, scale: float = 2.0,
                 n_ctx: int = 512, table: Optional[np.ndarray] = None, pass_seconds: float = 0.0) -> None:
        rng = np.random.default_rng(seed)
        shape = (n_vocab,) * order + (n_vocab,)
        self.table = (table if table is not None else rng.normal(0.0, scale, size=shape)).astype(np.float32)
        self.order = order
        self._n_vocab = n_vocab
        self._n_ctx = n_ctx
        self.tokens: list[int] = []
        self.evaluated = 0  # tokens fed through eval: counts re-evaluation
        self.pass_seconds = pass_seconds

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def row(self, context: Sequence[int]) -> np.ndarray:
        """Logits after ``context`` (padded on the left with token 0)."""
        ctx = [0] * self.order + list(context)
        return self.table[tuple(ctx[-self.order:])]

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        if self.pass_seconds:
            time.sleep(self.pass_seconds)
        tokens = list(tokens)
        if not 1 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits={n_logits} with {len(tokens)} tokens")
        if len(self.tokens) + len(tokens) > self._n_ctx:
            raise RuntimeError("context overflow in MarkovLM")
        self.tokens.extend(tokens)
        self.evaluated += len(tokens)
        n = len(self.tokens)
        return np.ascontiguousarray(np.stack([self.row(self.tokens[: n - n_logits + i + 1])
                                              for i in range(n_logits)]))

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


class ByteTokenizer:
    """Token t is the single character chr(ord('a') + t); optional EOG id."""

    def __init__(self, eog: Optional[int] = None) -> None:
        self.eog = eog

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) - ord("a") for c in text]

    def token_bytes(self, token: int) -> bytes:
        return chr(ord("a") + token).encode()

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    def chat_prompt(self, messages, *, add_generation_prompt: bool = True):
        return "".join(m["content"] for m in messages)


class GrammarByteTokenizer(ByteTokenizer):
    """A ``ByteTokenizer`` whose end-of-generation token ``eog`` is a control
    token, with the vocabulary as llguidance's tokenizer (``grammar_tokenizer``)
    so that decoders can follow grammars over synthetic models."""

    def __init__(self, n_vocab: int, eog: int) -> None:
        super().__init__(eog=eog)
        self.n_vocab = n_vocab
        self._llg = None

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == self.eog else super().token_bytes(token)

    def grammar_tokenizer(self):
        import llguidance

        if self._llg is None:
            tok = self

            class View:  # what llguidance.TokenizerWrapper reads
                tokens = [b"\xff<eos>" if t == tok.eog else chr(ord("a") + t).encode() for t in range(tok.n_vocab)]
                special_token_ids = [tok.eog]
                eos_token_id = tok.eog
                bos_token_id = None

                def __call__(self, text):
                    if not isinstance(text, str):
                        raise TypeError("text must be a str")
                    return [ord(c) - ord("a") for c in text]

            self._llg = llguidance.LLTokenizer(llguidance.TokenizerWrapper(View()), n_vocab=self.n_vocab,
                                               eos_token=[self.eog])
        return self._llg

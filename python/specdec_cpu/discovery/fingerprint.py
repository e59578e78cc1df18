"""A vocabulary's fingerprint, and the draft/target rule applied to two of them.

The rule is ``engine.check_vocab_compatible``'s: the same vocabulary type,
the same BOS and EOS ids, and the same token texts over the ids both have
(sizes may differ: padding ids at the end of one vocabulary).  A fingerprint
keeps one 64-bit hash per token text, so the texts of two vocabularies of
different sizes are compared over their common prefix without the files; its
``digest`` (type, BOS, EOS and every text) names the whole vocabulary.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["VocabPrint", "make_print", "mismatch"]


@dataclass(frozen=True)
class VocabPrint:
    """What the vocabulary rule compares, for one model."""

    vocab_type: Optional[str]
    bos: Optional[int]
    eos: Optional[int]
    hashes: np.ndarray  # uint64, one per token id
    digest: str

    @property
    def n_vocab(self) -> int:
        return int(len(self.hashes))


def token_hashes(texts: Sequence[bytes]) -> np.ndarray:
    """One 64-bit BLAKE2b hash of each token text."""
    out = np.empty(len(texts), dtype="<u8")
    for i, text in enumerate(texts):
        out[i] = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return out


def _digest(vocab_type: Optional[str], bos: Optional[int], eos: Optional[int], hashes: np.ndarray) -> str:
    h = hashlib.sha256(f"{vocab_type}|{bos}|{eos}|{len(hashes)}|".encode())
    h.update(np.ascontiguousarray(hashes, dtype="<u8").tobytes())
    return h.hexdigest()[:16]


def make_print(vocab_type: Optional[str], bos: Optional[int], eos: Optional[int],
               texts_or_hashes) -> VocabPrint:
    """A fingerprint from token texts (bytes) or from their stored hashes."""
    if isinstance(texts_or_hashes, np.ndarray):
        hashes = texts_or_hashes.astype("<u8", copy=False)
    else:
        hashes = token_hashes(texts_or_hashes)
    return VocabPrint(vocab_type, bos, eos, hashes, _digest(vocab_type, bos, eos, hashes))


def mismatch(target: VocabPrint, draft: VocabPrint) -> Optional[str]:
    """None when ``draft`` may draft for ``target``, else why not (one phrase)."""
    if target.vocab_type != draft.vocab_type:
        return f"vocabulary types differ ({target.vocab_type} vs {draft.vocab_type})"
    if target.bos != draft.bos:
        return f"BOS ids differ ({target.bos} vs {draft.bos})"
    if target.eos != draft.eos:
        return f"EOS ids differ ({target.eos} vs {draft.eos})"
    if target.digest == draft.digest:
        return None
    n = min(target.n_vocab, draft.n_vocab)
    if n == 0:
        return "no vocabulary"
    differ = np.flatnonzero(target.hashes[:n] != draft.hashes[:n])
    if differ.size:
        return f"token texts differ (first at id {int(differ[0])})"
    return None

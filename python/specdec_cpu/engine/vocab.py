"""LlamaTokenizer (implements ``Tokenizer``) and the draft/target vocabulary check."""

from __future__ import annotations

import ctypes
import warnings
from itertools import repeat
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np

from ..errors import VocabMismatchError
from .backend import lib

if TYPE_CHECKING:
    from .weights import LlamaWeights

__all__ = ["LlamaTokenizer", "check_vocab_compatible", "token_texts", "VOCAB_TYPE_NAMES"]

VOCAB_TYPE_NAMES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}

_LLAMA_TOKEN_NULL = -1
_INT32_MIN = -(2**31)


def _special_id(value: int, n_vocab: int) -> Optional[int]:
    value = int(value)
    return value if 0 <= value < n_vocab else None


class LlamaTokenizer:
    """The vocabulary of a :class:`LlamaWeights`; implements ``Tokenizer``.

    Token pieces are cached, so ``token_bytes`` is a list lookup after the
    first call for a given id.  Thread-safe for reading.
    """

    def __init__(self, weights: "LlamaWeights") -> None:
        self._weights = weights
        self._vocab = weights.vocab_ptr
        self._n_vocab = weights.n_vocab
        self._pieces: List[Optional[bytes]] = [None] * self._n_vocab
        self._type = int(lib.llama_vocab_type(self._vocab))
        self._bos = _special_id(lib.llama_vocab_bos(self._vocab), self._n_vocab)
        self._eos = _special_id(lib.llama_vocab_eos(self._vocab), self._n_vocab)
        self._add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))
        self._add_eos = bool(lib.llama_vocab_get_add_eos(self._vocab))
        self._eog: Optional[frozenset] = None

    # -- properties ------------------------------------------------------

    @property
    def weights(self) -> "LlamaWeights":
        return self._weights

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def vocab_type(self) -> int:
        """llama.cpp's vocabulary type (1 = SentencePiece, 2 = byte-level BPE, ...)."""
        return self._type

    @property
    def vocab_type_name(self) -> str:
        return VOCAB_TYPE_NAMES.get(self._type, str(self._type))

    @property
    def bos(self) -> Optional[int]:
        """The BOS id, or None if the vocabulary has none."""
        return self._bos

    @property
    def eos(self) -> Optional[int]:
        """The EOS id, or None if the vocabulary has none."""
        return self._eos

    @property
    def add_bos(self) -> bool:
        """True if ``tokenize(..., add_special=True)`` prepends BOS."""
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @property
    def fim_ids(self) -> Dict[str, int]:
        """The fill-in-the-middle tokens the GGUF names (of ``pre``, ``suf``,
        ``mid``, ``pad``, ``rep``, ``sep``), by name; empty for a model
        without them."""
        ids = {}
        for name in ("pre", "suf", "mid", "pad", "rep", "sep"):
            t = _special_id(getattr(lib, f"llama_vocab_fim_{name}")(self._vocab), self._n_vocab)
            if t is not None:
                ids[name] = t
        return ids

    # -- Tokenizer -------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> List[int]:
        """Token ids of ``text``; BOS is prepended when the model asks for it
        and ``add_special``.  ``parse_special`` turns texts such as
        ``<|im_start|>`` into their control tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8", errors="strict")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"text is not valid Unicode: {exc.reason} at index {exc.start} "
                f"({text[exc.start:exc.end]!r}); lone surrogates cannot be tokenized"
            ) from None
        self._weights._require()
        cap = len(data) + 8
        while True:
            buf = (ctypes.c_int32 * cap)()
            n = int(lib.llama_tokenize(self._vocab, data, len(data), buf, cap,
                                       bool(add_special), bool(parse_special)))
            if n == _INT32_MIN:
                raise ValueError(f"text too long to tokenize ({len(data)} bytes)")
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of ``token`` (possibly a partial UTF-8 sequence).

        Control tokens render as their text (e.g. ``b"<|im_end|>"``).
        """
        try:
            piece = self._pieces[token]
        except (IndexError, TypeError):
            piece = None
            self._check_token(token)
        if piece is None:
            self._check_token(token)
            piece = self._piece(int(token))
            self._pieces[token] = piece
        return piece

    def _check_token(self, token: object) -> None:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"token must be an int, got {token!r}")
        if not 0 <= int(token) < self._n_vocab:
            raise ValueError(f"token id {int(token)} out of range [0, {self._n_vocab})")

    def _piece(self, token: int) -> bytes:
        # A buffer per call: the ctypes call releases the GIL, so a shared
        # buffer could be filled by two threads at once.  Pieces are cached,
        # so this runs once per token id.
        self._weights._require()
        size = 64
        buf = ctypes.create_string_buffer(size)
        n = int(lib.llama_token_to_piece(self._vocab, token, buf, size, 0, True))
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = int(lib.llama_token_to_piece(self._vocab, token, buf, size, 0, True))
        return buf.raw[:max(n, 0)]

    def detokenize(self, tokens: Sequence[int], *, errors: str = "replace") -> str:
        """The text of ``tokens`` (pieces concatenated, then UTF-8 decoded)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"token must be an int, got {token!r}")
        if not 0 <= token < self._n_vocab:
            return False
        if self._weights._model is None:
            raise ValueError(f"the model {self._weights.path} is closed")
        return bool(lib.llama_vocab_is_eog(self._vocab, int(token)))

    @property
    def eog_ids(self) -> frozenset:
        """All end-of-generation ids (computed once)."""
        if self._eog is None:
            self._weights._require()
            vocab = self._vocab
            fn = lib.llama_vocab_is_eog
            self._eog = frozenset(i for i in range(self._n_vocab) if fn(vocab, i))
        return self._eog

    def token_text(self, token: int) -> str:
        """The token's text as stored in the vocabulary (not its bytes)."""
        self._check_token(token)
        self._weights._require()
        raw = lib.llama_vocab_get_text(self._vocab, int(token))
        return (raw or b"").decode("utf-8", "replace")

    @property
    def chat_template(self) -> Optional[str]:
        """The model's default chat template source, or None."""
        self._weights._require()
        raw = lib.llama_model_chat_template(self._weights.model_ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def chat_prompt(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> Optional[str]:
        """The model's chat template applied to ``messages`` (dicts with
        ``role`` and ``content`` strings); None if the model has no template
        or llama.cpp does not recognise it (a warning says so)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a sequence of {'role': str, 'content': str} dicts")
        encoded = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise TypeError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
            role, content = msg.get("role"), msg.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise TypeError(f"messages[{i}] needs str 'role' and 'content', got {msg!r}")
            try:
                encoded.append((role.encode("utf-8"), content.encode("utf-8")))
            except UnicodeEncodeError as exc:
                raise ValueError(f"messages[{i}] is not valid Unicode: {exc.reason}") from None
        self._weights._require()
        tmpl = lib.llama_model_chat_template(self._weights.model_ptr, None)
        if not tmpl:
            return None
        arr = (lib.llama_chat_message * max(len(encoded), 1))()
        for i, (role, content) in enumerate(encoded):
            arr[i].role = role
            arr[i].content = content
        size = 2 * sum(len(r) + len(c) for r, c in encoded) + 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(lib.llama_chat_apply_template(tmpl, arr, len(encoded), bool(add_generation_prompt), buf, size))
            if n < 0:
                warnings.warn(
                    f"the chat template of {self._weights.path} is not one llama.cpp recognises; "
                    "no chat formatting applied",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return None
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1


def check_vocab_compatible(target: "LlamaWeights", draft: "LlamaWeights") -> None:
    """Raise VocabMismatchError unless ``draft`` can draft for ``target``.

    Both must have the same vocabulary type, the same BOS/EOS ids and the
    same token texts over their shared id range ``[0, min(n_vocab))``.  The
    sizes may differ (padding rows at the end of one vocabulary).  A draft
    cut to part of a vocabulary (engine/vocab_cut.py) is compared through
    its ``source_ids``: each of its tokens against the target's token of
    that id.
    """
    tv, dv = target.vocab_ptr, draft.vocab_ptr
    t_type, d_type = int(lib.llama_vocab_type(tv)), int(lib.llama_vocab_type(dv))
    if t_type != d_type:
        raise VocabMismatchError(
            f"vocabulary types differ: target {target.path} is {VOCAB_TYPE_NAMES.get(t_type, t_type)}, "
            f"draft {draft.path} is {VOCAB_TYPE_NAMES.get(d_type, d_type)}"
        )
    source = draft.source_ids
    a: Optional[int]
    b: Optional[int]
    for what, fn in (("BOS", lib.llama_vocab_bos), ("EOS", lib.llama_vocab_eos)):
        a, b = int(fn(tv)), int(fn(dv))
        a = a if a >= 0 else None
        b = b if b >= 0 else None
        if b is not None and source is not None:
            b = int(source[b])
        if a != b:
            raise VocabMismatchError(f"{what} ids differ: target {target.path} has {a}, draft {draft.path} has {b}")

    t_texts = token_texts(target)
    d_texts = token_texts(draft)
    if source is not None:
        if int(source[-1]) >= target.n_vocab:
            raise VocabMismatchError(f"draft {draft.path} is cut from a vocabulary of more tokens than "
                                     f"target {target.path} has ({int(source[-1]) + 1} > {target.n_vocab})")
        t_texts = [t_texts[i] for i in source]
    n = min(len(t_texts), len(d_texts))
    if t_texts[:n] == d_texts[:n]:  # one C-level comparison of two lists of bytes
        return
    ids = [i for i in range(n) if t_texts[i] != d_texts[i]]
    shown = ", ".join(
        f"id {i}: target {t_texts[i].decode('utf-8', 'replace')!r} vs draft {d_texts[i].decode('utf-8', 'replace')!r}"
        for i in ids[:3]
    )
    more = f" (and {len(ids) - 3} more)" if len(ids) > 3 else ""
    raise VocabMismatchError(
        f"token texts differ between target {target.path} and draft {draft.path}, "
        f"first differing id {ids[0]}: {shown}{more}"
    )


def token_texts(weights: "LlamaWeights") -> List[bytes]:
    """Every token's text as stored in the vocabulary, fetched once per model."""
    cached = getattr(weights, "_token_texts", None)
    if cached is not None and len(cached) == weights.n_vocab:
        return cached
    vocab = weights.vocab_ptr
    n = weights.n_vocab
    texts = list(map(lib.llama_vocab_get_text, repeat(vocab, n), range(n)))
    texts = [t if t is not None else b"" for t in texts] if None in texts else texts
    weights._token_texts = texts
    return texts

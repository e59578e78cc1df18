"""A model's vocabulary as llguidance's ``LLTokenizer``, for grammar masks.

llguidance needs every token's bytes, which tokens are special, the
end-of-generation ids and a tokenizer (it tokenizes forced text into
fast-forward tokens).  Its own ``llguidance.llamacpp`` adapter hands it
llama.cpp's raw vocabulary pointer; this one passes the engine's
:class:`LlamaTokenizer` instead, for three reasons:

* **lifetime**: a raw pointer would dangle once the weights are closed;
  here tokenizing raises a ValueError then instead of reading freed memory;
* **user-defined tokens are text**: llguidance's adapter marks
  user-defined tokens that look like ``<...>`` special.  Qwen2.5's
  ``<tool_call>`` is such a token, and with it marked special llguidance's
  mask (which narrows forced text to the tokenizer's own token, 151657)
  allowed a token its matcher then refused.  Only control tokens are
  special here, so ``"<tool_call>"`` in a grammar is matched by that
  single token, as the model writes it;
* **no SentencePiece space prefix**: forced text is tokenized as it
  continues the output, not as the start of one (which would get a space);
* **every end-of-generation id** (``LlamaTokenizer.eog_ids``: EOS, EOT,
  Qwen's ``<|endoftext|>`` ...) is an EOS for llguidance, so the mask allows
  each of them exactly where the grammar accepts, and consuming any one
  ends the constraint.

llguidance marks special tokens by a leading 0xFF byte, so a plain byte
token 0xFF also reads as special (``is_special_token``); harmless, as 0xFF
never occurs in UTF-8 text.

Building takes ~1 s for a 152k vocabulary, so it is cached per weights.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, List, Optional, Union

from .backend import lib
from .vocab import LlamaTokenizer

if TYPE_CHECKING:
    import llguidance

    from .weights import LlamaWeights

__all__ = ["llg_tokenizer"]

_SENTINEL = "\n"

_cache: "weakref.WeakKeyDictionary[LlamaWeights, llguidance.LLTokenizer]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _VocabView:
    """What ``llguidance.TokenizerWrapper`` reads: token bytes, special ids,
    BOS/EOS, and a call that tokenizes text (no BOS, no special tokens)."""

    def __init__(self, tok: LlamaTokenizer) -> None:
        vocab = tok.weights.vocab_ptr
        n = tok.n_vocab
        # Weakly: the cache maps weights -> LLTokenizer, and a value holding
        # its key strongly would keep the weights alive for ever.
        self._weights = weakref.ref(tok.weights)
        self.tokens: List[bytes] = [tok.token_bytes(t) for t in range(n)]
        control = lib.LLAMA_TOKEN_ATTR_CONTROL
        self.special_token_ids = [t for t in range(n) if lib.llama_vocab_get_attr(vocab, t) & control]
        self.eos_token_id = tok.eos
        self.bos_token_id = tok.bos
        # SentencePiece vocabularies put a space before the text they
        # tokenize; text forced mid-output must not get one.  Such text is
        # tokenized after a sentinel newline whose tokens are then dropped.
        adds_space = b"".join(map(tok.token_bytes, self._tokenize(tok, "a"))) != b"a"
        self._prefix = self._tokenize(tok, _SENTINEL) if adds_space else None

    def __call__(self, text: Union[str, bytes]) -> List[int]:
        # Refusing bytes makes TokenizerWrapper hand us str (it probes with b"test").
        if not isinstance(text, str):
            raise TypeError("text must be a str")
        weights = self._weights()
        if weights is None or weights.closed:
            raise ValueError("the model of this grammar tokenizer is closed")
        tok = LlamaTokenizer(weights)
        prefix = self._prefix
        if prefix is not None:
            ids = self._tokenize(tok, _SENTINEL + text)
            n = len(prefix)
            if ids[:n] == prefix and b"".join(map(tok.token_bytes, ids[n:])) == text.encode("utf-8"):
                return ids[n:]
        return self._tokenize(tok, text)

    @staticmethod
    def _tokenize(tok: LlamaTokenizer, text: str) -> List[int]:
        # parse_special=False: control-token texts in a grammar are text, as
        # llguidance's masks treat them (user-defined tokens are still matched).
        return tok.tokenize(text, add_special=False, parse_special=False)


def llg_tokenizer(weights: "LlamaWeights", *, eos_ids: Optional[List[int]] = None) -> "llguidance.LLTokenizer":
    """The llguidance tokenizer of ``weights``' vocabulary, built once per
    weights object (thread-safe).

    ``eos_ids`` overrides the end-of-generation ids (default: all of the
    model's, ``LlamaTokenizer.eog_ids``); an override is not cached.  The
    result's ``vocab_size`` equals ``weights.n_vocab`` (the logits' width).
    A draft cut to part of a vocabulary is refused: decoders speak the
    source vocabulary's ids, so masks must come from the target's tokenizer.
    """
    import llguidance

    if weights.source_ids is not None:
        raise ValueError(f"{weights.path} is cut to part of a vocabulary; build the grammar tokenizer "
                         "from the model whose ids the decoder speaks (the target)")
    if eos_ids is None:
        with _lock:
            cached = _cache.get(weights)
            if cached is not None:
                return cached
    tok = LlamaTokenizer(weights)
    eos = sorted(tok.eog_ids) if eos_ids is None else sorted(int(t) for t in eos_ids)
    if not eos:
        raise ValueError(f"{weights.path} has no end-of-generation token; a grammar needs one to end")
    view = _VocabView(tok)
    result = llguidance.LLTokenizer(llguidance.TokenizerWrapper(view), n_vocab=weights.n_vocab, eos_token=eos)
    if eos_ids is None:
        with _lock:
            result = _cache.setdefault(weights, result)
    return result

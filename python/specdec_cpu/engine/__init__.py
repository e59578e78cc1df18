"""The llama.cpp adapter: the only part of specdec-cpu that imports ``llama_cpp``.

* :class:`LlamaWeights` -- a GGUF model loaded once (memory-mapped).
* :class:`LlamaContext` -- a KV cache over the weights; implements ``CausalLM``.
* :class:`LlamaMultiContext` -- one KV cache holding many sequences decoded
  together; implements ``SequenceLM``.
* :class:`LlamaEmbedder` -- pooled, normalised embeddings in a context of their own.
* :func:`load_pair` -- a target and a draft loaded and checked together (:class:`ModelPair`).
* :class:`LlamaTokenizer` -- the model's vocabulary; implements ``Tokenizer``.
* :func:`check_vocab_compatible` -- can a draft model speculate for a target?
* :func:`quantize` -- write a GGUF at another precision.
* :func:`cut_vocab`, :func:`cached_cut`, :func:`cut_draft` -- a draft cut to the common part
  of its vocabulary (written, cached, or as a decoder's ``draft_vocab`` asks).
* :func:`release_threads` -- give back the calling thread's OpenMP workers.
* :func:`llg_tokenizer` -- the vocabulary as llguidance's tokenizer (grammar masks).
"""

from __future__ import annotations

from .context import DecodeError, LlamaContext
from .embedding import LlamaEmbedder
from .grammar_tokenizer import llg_tokenizer
from .loading import ModelPair, load_pair
from .multi_context import LlamaMultiContext, SequenceView
from .openmp import release_threads
from .quantize import FTYPES, quantize
from .vocab import LlamaTokenizer, check_vocab_compatible
from .vocab_cut import cached_cut, cut_draft, cut_vocab
from .weights import LlamaWeights

__all__ = [
    "LlamaWeights",
    "LlamaContext",
    "LlamaMultiContext",
    "SequenceView",
    "LlamaEmbedder",
    "ModelPair",
    "load_pair",
    "LlamaTokenizer",
    "DecodeError",
    "check_vocab_compatible",
    "quantize",
    "cached_cut",
    "cut_draft",
    "cut_vocab",
    "FTYPES",
    "release_threads",
    "llg_tokenizer",
]

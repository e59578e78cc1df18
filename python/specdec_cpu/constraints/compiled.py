"""Compiling a ``Grammar`` for one tokenizer, once, in a process-wide LRU cache."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Optional, Tuple

from ..errors import InvalidGrammarError
from .grammar import Grammar, first_lines
from .state import ConstraintState

if TYPE_CHECKING:
    import llguidance

__all__ = ["CompiledGrammar", "compile_grammar", "clear_cache", "CACHE_SIZE"]

#: Compiled grammars kept (a JSON schema's lexer is tens of kB to a few MB).
CACHE_SIZE = 128


class CompiledGrammar:
    """A grammar checked and compiled for one tokenizer; makes per-sequence
    :class:`ConstraintState` objects.  Thread-safe."""

    def __init__(self, grammar: Grammar, tokenizer: "llguidance.LLTokenizer", matcher: "llguidance.LLMatcher") -> None:
        self.grammar = grammar
        self.tokenizer = tokenizer
        self._prototype = matcher  # never advanced: states are copies
        self._lock = threading.Lock()
        self.eos_set = frozenset(int(t) for t in tokenizer.eos_tokens)

    @property
    def n_vocab(self) -> int:
        """Width of a mask row in token ids (the tokenizer's vocabulary)."""
        return int(self.tokenizer.vocab_size)

    @property
    def eos_ids(self) -> Tuple[int, ...]:
        """The ids allowed where the grammar accepts, ending it."""
        return tuple(self.tokenizer.eos_tokens)

    def new_state(self) -> ConstraintState:
        """A fresh matcher at the start of the output (a copy of a compiled
        prototype: about a microsecond, no recompilation)."""
        with self._lock:
            matcher = self._prototype.deep_copy()
        return ConstraintState(matcher, self)

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.grammar.what}, n_vocab={self.n_vocab})"


_cache: "OrderedDict[Tuple[int, Grammar], CompiledGrammar]" = OrderedDict()
_cache_lock = threading.Lock()


def compile_grammar(grammar: Grammar, tokenizer: "llguidance.LLTokenizer", *,
                    param: Optional[str] = None) -> CompiledGrammar:
    """``grammar`` compiled for ``tokenizer`` (see ``engine.llg_tokenizer``),
    from the cache when it was compiled before for the same tokenizer object.

    Raises InvalidGrammarError naming what is wrong (an HTTP 400; ``param``
    is copied to the error).  Compiling a large schema can take tens of
    milliseconds; llguidance releases the GIL meanwhile.
    """
    if not isinstance(grammar, Grammar):
        raise TypeError(f"grammar must be a Grammar, got {type(grammar).__name__}")
    # The entry holds the tokenizer, so its id cannot be reused while cached.
    key = (id(tokenizer), grammar)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    compiled = _compile(grammar, tokenizer, param)
    with _cache_lock:
        compiled = _cache.setdefault(key, compiled)
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def clear_cache() -> None:
    """Forget every compiled grammar."""
    with _cache_lock:
        _cache.clear()


def _compile(grammar: Grammar, tokenizer: "llguidance.LLTokenizer", param: Optional[str]) -> CompiledGrammar:
    import llguidance

    try:
        text = grammar.llguidance_grammar()
    except InvalidGrammarError as exc:
        raise InvalidGrammarError(str(exc), param=param or exc.param) from None
    # log_level=0: problems come back through get_error(), not stderr.
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    if matcher.is_error():
        raise InvalidGrammarError(f"invalid {grammar.what}: {first_lines(matcher.get_error())}", param=param)
    return CompiledGrammar(grammar, tokenizer, matcher)

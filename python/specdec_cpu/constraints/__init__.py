"""Structured output: grammars and JSON schemas as per-position token masks.

A constraint gives, for each position, the set of token ids the output may
continue with, as a function of what was generated so far.  The decoders
mask the target's and the draft's distributions with it (mask first, then
temperature / top-k / top-p / min-p), consume drafted tokens, roll back to
the accepted prefix after verification, and draft forced tokens for free.
End of generation is allowed only where the grammar accepts.

* :class:`Grammar` -- what to match: a JSON schema (dict, JSON text or a
  pydantic model class), any JSON object, Lark, regex or GBNF;
  :func:`from_response_format` reads OpenAI's ``response_format``.
* :class:`Triggered` -- a grammar that applies after a trigger token only
  (a tool call after ``<tool_call>``: free text before it).
* :func:`compile_grammar` -- a grammar checked and compiled for one
  tokenizer (``engine.llg_tokenizer``), cached;
  :class:`CompiledGrammar` makes :class:`ConstraintState` objects.
* :class:`ConstraintState` -- one sequence's matcher: ``fill_mask``,
  ``forced_tokens``, ``consume``, ``rollback``, ``accepting``, ``finished``.
* :mod:`.bitmask` -- the mask layout (``ceil(V/32)`` 32-bit words, bit
  ``t % 32`` of word ``t // 32``) and numpy helpers.

Built on llguidance; nothing here imports llama.cpp.
"""

from __future__ import annotations

from . import bitmask
from .compiled import CompiledGrammar, clear_cache, compile_grammar
from .grammar import Grammar, JsonLayout, Triggered, from_response_format
from .state import ConstraintState

__all__ = [
    "Grammar",
    "JsonLayout",
    "Triggered",
    "from_response_format",
    "CompiledGrammar",
    "compile_grammar",
    "clear_cache",
    "ConstraintState",
    "bitmask",
]

"""Test-only references for grammar masks (not part of the package).

* :func:`consume_reference` -- every token a copy of the state accepts,
  tried one by one (llguidance's consume path, not its mask path);
* :func:`finite_language_reference` -- for a grammar whose language is a
  finite set of strings, the tokens whose bytes extend the output towards
  one of them, plus EOS where the output is one: pure Python and numpy,
  independent of llguidance;
* :func:`random_walk` -- a path of random allowed tokens.
"""

from __future__ import annotations

import random
from typing import Iterable, List, Optional, Sequence, Set

import numpy as np

from specdec_cpu.constraints import ConstraintState, bitmask


def allowed(state: ConstraintState) -> Set[int]:
    return set(bitmask.allowed_ids(state.mask(), state.n_vocab).tolist())


def consume_reference(state: ConstraintState, candidates: Optional[Iterable[int]] = None) -> Set[int]:
    out = set()
    for t in range(state.n_vocab) if candidates is None else candidates:
        if state.copy().consume([t]) == 1:
            out.add(t)
    return out


def expected_mask(state: ConstraintState, reference: Set[int]) -> Set[int]:
    """What the mask must be given the consume reference: the reference,
    except where text is forced: there llguidance narrows the mask to the
    one token its tokenizer gives for the forced text."""
    forced = state.forced_tokens(1)
    if forced:
        assert forced[0] in reference
        return {forced[0]}
    return reference


def finite_language_reference(words: Sequence[bytes], prefix: bytes, pieces: Sequence[bytes],
                              special: Set[int], eos: Set[int]) -> Set[int]:
    """Tokens allowed after ``prefix`` when the output must be one of ``words``."""
    rests = [w[len(prefix):] for w in words if w.startswith(prefix) and len(w) > len(prefix)]
    ok = np.zeros(len(pieces), dtype=bool)
    for i, piece in enumerate(pieces):
        if piece and i not in special:
            ok[i] = any(rest.startswith(piece) for rest in rests)
    out = set(np.flatnonzero(ok).tolist())
    if prefix in words:
        out |= eos
    return out


def forced_text(words: Sequence[bytes], prefix: bytes) -> bytes:
    """The bytes every continuation of ``prefix`` starts with (none when
    ``prefix`` is itself a word: EOS may come next)."""
    if prefix in words:
        return b""
    rests = [w[len(prefix):] for w in words if w.startswith(prefix)]
    common = rests[0]
    for rest in rests[1:]:
        n = 0
        while n < min(len(common), len(rest)) and common[n] == rest[n]:
            n += 1
        common = common[:n]
    return common


def random_walk(state: ConstraintState, rng: random.Random, max_steps: int,
                stop_at_eos: bool = True) -> List[int]:
    """Consume random allowed tokens (EOS included where allowed) until the
    grammar ends or ``max_steps``; returns the tokens."""
    tokens: List[int] = []
    eos = set(state.eos_ids)
    for _ in range(max_steps):
        if state.ended:
            break
        choices = sorted(allowed(state))
        assert choices, "an unended state allows some token"
        t = rng.choice(choices)
        if t in eos and not stop_at_eos and len(choices) > 1:
            t = rng.choice([c for c in choices if c not in eos])
        assert state.consume([t]) == 1
        tokens.append(t)
    return tokens


def masked_output_law(row_after, compiled, prompt: List[int], params, eog: Iterable[int],
                      floor: float = 0.005) -> dict:
    """P(whole output) of plain sampling from a target masked by a grammar
    whose language is finite: ``row_after(ids)`` gives the target's logits
    row after ``ids``; outputs are token tuples (several tokenizations of a
    text are different outcomes), ending at an EOG token (not included).
    Branches below ``floor`` are left out (their mass is 1 − the sum)."""
    from stats_helpers import expected_distribution

    eog = set(int(t) for t in eog)
    law: dict = {}

    def walk(prefix: tuple, prob: float) -> None:
        state = compiled.new_state()
        assert state.consume(list(prefix)) == len(prefix)
        row = np.asarray(row_after(list(prompt) + list(prefix)), dtype=np.float64)
        allowed = bitmask.to_bool(state.mask(), row.size)
        p = expected_distribution(np.where(allowed, row, -np.inf), params=params)
        for t in np.flatnonzero(p >= floor):
            if int(t) in eog:
                law[prefix] = law.get(prefix, 0.0) + prob * p[t]
            else:
                walk(prefix + (int(t),), prob * p[t])

    walk((), 1.0)
    return law

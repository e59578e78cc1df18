"""Joined hard-wrapped lines: the second text prompt lookup searches.

- Which line breaks are wrapping (joined) and which are structure (kept).
- The decoder hands each generation's joined lines to the n-gram drafter,
  and greedy decoding with them still equals plain decoding.
- Drafts copied from the joined lines are verified like any other one-hot
  draft: the output follows the target's distribution (chi-square).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution
from synthetic import MarkovLM

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.drafters import NgramDrafter
from specdec_cpu.drafters.unwrap import unwrapped_lines, unwrapped_reference

GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize("text, expected", [
    ("Unplug the grinder before\ncleaning. Empty the hopper\nand run it.",
     ["Unplug the grinder before cleaning. Empty the hopper and run it."]),
    ("one line only", []),
    ("first paragraph\nwraps here\n\nsecond stands alone\n\nthird\nwraps too",
     ["first paragraph wraps here", "third wraps too"]),
    ("trailing space   \nis dropped", ["trailing space is dropped"]),
    # Indented lines are code or quotes: their breaks are kept.
    ("def f(x):\n    return x\n", []),
    ("Text before\n    indented\nafter", []),
    # A Markdown code fence holds code: nothing inside it (or the fence) is joined.
    ("See:\n```python\nimport os\nimport sys\n```\nand then\nmore", ["and then more"]),
    ("~~~\na\nb\n~~~", []),
    ("crlf\r\nline", ["crlf line"]),
])
def test_which_breaks_are_joined(text, expected):
    assert unwrapped_lines(text) == expected


class CharTokenizer:
    """One token per character of a small alphabet (space and newline included)."""

    ALPHABET = "abcd \n"

    def tokenize(self, text, *, add_special=True, parse_special=True):
        return [self.ALPHABET.index(c) for c in text]

    def token_bytes(self, token):
        return self.ALPHABET[token].encode()

    def is_eog(self, token):
        return False

    def chat_prompt(self, messages, *, add_generation_prompt=True):
        return None


def test_reference_tokens():
    tok = CharTokenizer()
    prompt = tok.tokenize("ab\ncd\n\nda")
    assert unwrapped_reference(prompt, tok) == [tok.tokenize("ab cd")]
    assert unwrapped_reference(tok.tokenize("abcd"), tok) == []


class RecordingDrafter(NgramDrafter):
    """Keeps every lookup the decoder makes (one per generation)."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingDrafter.made.append(self)


@pytest.fixture
def recorded(monkeypatch):
    import specdec_cpu.decoding.loop as loop

    RecordingDrafter.made = []
    monkeypatch.setattr(loop, "NgramDrafter", RecordingDrafter)
    return RecordingDrafter.made


@pytest.mark.parametrize("unwrap", [True, False])
def test_decoder_gives_each_generation_its_joined_lines(unwrap, recorded):
    tok = CharTokenizer()
    n = len(tok.ALPHABET)
    plain = SpeculativeDecoder(MarkovLM(n, order=2, seed=3), tok, gamma=0)
    dec = SpeculativeDecoder(MarkovLM(n, order=2, seed=3), tok, gamma=4, ngram=True,
                             ngram_kwargs={"unwrap_lines": unwrap})
    for prompt in ("ab\ncd ab cd a", "dd\nba\n\nab"):
        expected = plain.generate(prompt, max_tokens=24, params=GREEDY).tokens
        assert dec.generate(prompt, max_tokens=24, params=GREEDY).tokens == expected
        first = prompt.split("\n\n")[0].replace("\n", " ")
        assert recorded[-1].reference == ([tok.tokenize(first)] if unwrap else [])


def test_combined_drafter_gets_the_joined_lines_too(recorded):
    tok = CharTokenizer()
    n = len(tok.ALPHABET)
    draft = MarkovLM(n, order=2, seed=4)
    dec = SpeculativeDecoder(MarkovLM(n, order=2, seed=3), tok, draft, ngram=True, gamma=3)
    dec.generate("ab\ncd", max_tokens=8, params=GREEDY)
    assert recorded[-1].reference == [tok.tokenize("ab cd")]


def test_bad_flag():
    with pytest.raises(ValueError, match="unwrap_lines"):
        NgramDrafter(unwrap_lines=1)


class CountingDrafter(NgramDrafter):
    """Counts the proposals copied from the reference."""

    from_reference = 0

    def propose(self, seq, gamma, params, rng):
        draft = super().propose(seq, gamma, params, rng)
        m = self.match(seq)
        if len(draft) and m.position < len(self._reference):
            CountingDrafter.from_reference += 1
        return draft


def test_drafts_from_the_joined_lines_are_exact(monkeypatch):
    import specdec_cpu.decoding.loop as loop

    monkeypatch.setattr(loop, "NgramDrafter", CountingDrafter)
    CountingDrafter.from_reference = 0
    tok = CharTokenizer()
    n = len(tok.ALPHABET)
    target = MarkovLM(n, order=2, seed=11, scale=1.0)
    prompt = tok.tokenize("ab\ncd\nab")  # looked up as "ab cd ab" too
    params = SamplingParams(temperature=0.9)
    dec = SpeculativeDecoder(target, tok, ngram=True, gamma=4, seed=5)
    counts = np.zeros((n, n, n))
    for _ in range(6000):
        counts[tuple(dec.generate(prompt, max_tokens=6, params=params).tokens[:3])] += 1
    joint = np.zeros((n, n, n))
    for a, b, c in itertools.product(range(n), repeat=3):
        joint[a, b, c] = (expected_distribution(target.row(prompt), params=params)[a]
                          * expected_distribution(target.row(prompt + [a]), params=params)[b]
                          * expected_distribution(target.row(prompt + [a, b]), params=params)[c])
    assert_matches_distribution(counts, joint, what="n-gram drafts from joined lines")
    assert CountingDrafter.from_reference > 500

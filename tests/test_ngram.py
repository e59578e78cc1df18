"""Prompt-lookup (n-gram) drafting: the index, the proposals, and exactness.

- The incremental index must always give the proposals of a brute-force
  search over the sequence, whatever interleaving of appends, proposals,
  rollbacks and new prompts led there.
- A deterministic draft is verified as q = one-hot: the emitted tokens must
  follow the target's joint distribution at any temperature (chi-square over
  synthetic Markov models, like test_decoder_exactness), alone and combined
  with a draft model.
- Greedy decoding with n-gram drafts equals plain greedy decoding.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_helpers import assert_matches_distribution, expected_distribution
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.drafters import Draft, NgramDrafter, NgramIndex

GREEDY = SamplingParams(temperature=0.0)


def brute_match(seq, max_ngram, min_ngram, candidates=8, max_match=64, prefer_before=0):
    """The specification of a match: the longest suffix n-gram (max_ngram
    down to min_ngram) with an earlier occurrence is the key; of its
    `candidates` most recent occurrences, the one whose match extends
    furthest back (at most max_match tokens) wins; on a tie one before
    `prefer_before` if any, the most recent otherwise; unanimous unless an
    equally long one was followed by another token.  Negative tokens
    separate texts: no match reaches over one or proposes one."""
    size = len(seq)

    def extent(i, n):
        length = n
        while length < min(max_match, i) and seq[i - 1 - length] == seq[size - 1 - length] >= 0:
            length += 1
        return length

    for n in range(max_ngram, min_ngram - 1, -1):
        suffix = seq[size - n:]
        if len(suffix) < n or min(suffix) < 0:
            continue  # nothing reaching over a separator (-1) is looked up
        found = [i for i in range(size - 1, n - 1, -1)
                 if seq[i - n:i] == suffix and seq[i] >= 0][:candidates]
        if found:
            best = max(found, key=lambda i: (extent(i, n), i < prefer_before, i))
            length = extent(best, n)
            unanimous = all(seq[i] == seq[best] for i in found if extent(i, n) == length)
            return (length, best, unanimous, seq[best])
    return None


def brute_force(seq, gamma, max_ngram, min_ngram, max_draft, candidates=8, max_match=64,
                reference=(), prefer_reference=False):
    """The specification of a proposal: the match in the reference texts
    (each closed by -1) followed by `seq`; what followed it, up to the end
    of its reference text, or in `seq` repeating with the period of the
    match where it reaches the end of the sequence."""
    text = [t for ref in reference for t in list(ref) + [-1]]
    base = len(text)
    text += list(seq)
    m = brute_match(text, max_ngram, min_ngram, candidates, max_match, base if prefer_reference else 0)
    if m is None:
        return []
    want = min(gamma, max_draft)
    if m[1] < base:
        following = text[m[1]:m[1] + want]
        return following[:following.index(-1)] if -1 in following else following
    period = len(text) - m[1]
    return [text[m[1] + j % period] for j in range(want)]


def propose(drafter, seq, gamma):
    return drafter.propose(seq, gamma, GREEDY, None).tokens.tolist()


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("kwargs, name", [
    ({"max_ngram": 0}, "max_ngram"),
    ({"min_ngram": 0}, "min_ngram"),
    ({"min_ngram": 3, "max_ngram": 2}, "min_ngram"),
    ({"max_draft": 0}, "max_draft"),
    ({"max_draft": True}, "max_draft"),
    ({"candidates": 0}, "candidates"),
    ({"max_match": 3}, r"max_match must be an int >= max_ngram \(4\), got 3"),
    ({"max_ngram": 100}, r"max_match must be an int >= max_ngram \(100\), got 64"),  # the default is too short
    ({"max_ngram": 2.0}, "max_ngram"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NgramDrafter(**kwargs)


# ---------------------------------------------------------------- proposals


def test_longest_match_wins():
    # (1, 2, 3) occurred once, followed by 4; (2, 3) occurred later, followed by 5.
    seq = [7, 1, 2, 3, 4, 2, 3, 5, 1, 2, 3]
    assert propose(NgramDrafter(max_ngram=3), seq, 3) == [4, 2, 3]
    assert propose(NgramDrafter(max_ngram=2, candidates=1), seq, 3) == [5, 1, 2]
    # With more candidates, the older (2, 3) wins: it shares (1, 2, 3) with the suffix.
    d = NgramDrafter(max_ngram=2)
    assert propose(d, seq, 3) == [4, 2, 3] and d.match(seq) == (3, 4, True, 4)
    assert NgramDrafter(max_ngram=2, max_match=2).match(seq) == (2, 7, False, 5)  # most recent; 4 or 5?


def test_most_recent_occurrence_period_and_length_limits():
    seq = [1, 2, 5, 1, 2, 6, 1, 2]
    d = NgramDrafter(max_ngram=2)
    assert d.match(seq) == (2, 5, False, 6)  # both share 2 tokens: the most recent wins, but 5 or 6?
    assert propose(d, seq, 8) == [6, 1, 2, 6, 1, 2, 6, 1]  # continues the period 3
    assert propose(d, seq, 2) == [6, 1]  # cut at gamma
    assert propose(NgramDrafter(max_ngram=2, max_draft=1), seq, 8) == [6]  # cut at max_draft
    assert propose(NgramDrafter(), [4, 4, 4], 5) == [4, 4, 4, 4, 4]
    # A match long enough to span the period is followed all the way back.
    assert NgramDrafter(max_ngram=2).match([3, 1, 2, 1, 2, 1, 2]) == (4, 5, True, 1)
    assert NgramDrafter(max_ngram=2, max_match=2).match([3, 1, 2, 1, 2, 1, 2]) == (2, 5, True, 1)  # both say 1


def test_no_match_gives_an_empty_one_hot_draft():
    d = NgramDrafter(max_ngram=3, min_ngram=2)
    for seq in ([], [4], [1, 2, 3, 4], [1, 2, 3, 1]):  # the last matches only as a unigram
        draft = d.propose(seq, 4, GREEDY, None)
        assert isinstance(draft, Draft) and len(draft) == 0
        assert draft.probs is None and draft.name == "ngram"
        assert d.match(seq) is None
    draft = d.propose([1, 2, 3, 1, 2], 4, GREEDY, None)
    assert draft.tokens.tolist() == [3, 1, 2, 3] and draft.probs is None and draft.name == "ngram"
    assert draft.tokens.dtype == np.int32
    assert d.match([1, 2, 3, 1, 2]) is not None
    assert propose(d, [1, 2, 3, 1, 2], 0) == []


def test_index_is_incremental():
    d = NgramDrafter(max_ngram=2)
    seq = [1, 2, 3]
    d.begin(seq)
    assert d.index.tokens == seq
    seq += [1, 2]
    assert propose(d, seq, 4) == [3, 1, 2, 3]
    assert d.index.tokens == seq
    d.rollback(len(seq) + 3)  # draft tokens the index never held: nothing to drop
    assert d.index.tokens == seq
    d.rollback(3)
    assert d.index.tokens == [1, 2, 3] and d.index.positions([1, 2]) == [2]
    d.begin([9, 9])  # a different prompt: realigned
    assert d.index.tokens == [9, 9] and propose(d, [9, 9], 4) == [9, 9, 9, 9]


# ---------------------------------------------------------------- index vs brute force


def fresh_index(tokens, max_ngram, min_ngram):
    idx = NgramIndex(max_ngram, min_ngram)
    idx.extend(tokens)
    return idx


OPS = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 3), min_size=1, max_size=6)),
    st.tuples(st.just("propose"), st.integers(0, 8)),
    st.tuples(st.just("rollback"), st.integers(0, 48)),
    st.tuples(st.just("begin"), st.integers(0, 48), st.lists(st.integers(0, 3), max_size=8)),
)


@settings(max_examples=300, deadline=None)
@given(
    orders=st.tuples(st.integers(1, 4), st.integers(1, 4)).map(sorted),
    max_draft=st.integers(1, 6),
    candidates=st.integers(1, 4),
    extra_match=st.integers(0, 6),
    alphabet=st.integers(2, 4),
    start=st.lists(st.integers(0, 3), max_size=12),
    reference=st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=3),
    ops=st.lists(OPS, max_size=40),
)
def test_index_matches_brute_force(orders, max_draft, candidates, extra_match, alphabet, start,
                                   reference, ops):
    min_n, max_n = orders
    limits = dict(candidates=candidates, max_match=max_n + extra_match)
    d = NgramDrafter(max_ngram=max_n, min_ngram=min_n, max_draft=max_draft, **limits)
    reference = [[t % alphabet for t in ref] for ref in reference]
    text = [t for ref in reference for t in ref + [-1]]
    d.set_reference(reference)
    assert d.reference == reference
    seq = [t % alphabet for t in start]
    d.begin(seq)

    def spec(gamma):
        # Which text wins a tie is learnt from the tokens (tested below): read it.
        return brute_force(seq, gamma, max_n, min_n, max_draft, **limits, reference=reference,
                           prefer_reference=d._prefer_reference)

    for op in ops:
        if op[0] == "append":  # tokens the decoder accepted
            seq = seq + [t % alphabet for t in op[1]]
        elif op[0] == "propose":
            assert propose(d, seq, op[1]) == spec(op[1]), seq
            prefer = len(text) if d._prefer_reference else 0
            assert d.match(seq) == brute_match(text + seq, max_n, min_n, **limits, prefer_before=prefer)
            assert d.index.tokens == text + seq
            assert d.index._pos == fresh_index(text + seq, max_n, min_n)._pos
        elif op[0] == "rollback":  # keep the first n (may be beyond what is indexed)
            d.rollback(op[1])
            seq = seq[:op[1]]
        else:  # a new prompt sharing some prefix with the old sequence
            seq = seq[:op[1]] + [t % alphabet for t in op[2]]
            d.begin(seq)
            assert d.index.tokens == text + seq and not d._prefer_reference
    for gamma in (1, 3, 16):
        assert propose(d, seq, gamma) == spec(gamma)
    assert d.index._pos == fresh_index(text + seq, max_n, min_n)._pos


def test_reference_ties_go_to_the_text_last_followed():
    # The reference holds a line the sequence holds wrapped: 9 is the line break.
    d = NgramDrafter(max_ngram=2)
    d.set_reference([[1, 2, 3, 4, 5]])
    base = 6  # the reference and its separator come first
    seq = [7, 1, 2, 9, 3, 4, 5, 8, 1, 2]
    d.begin(seq)
    # [1, 2] occurs in both, as far back: the sequence wins at first, and
    # the occurrences disagree on what comes next.
    assert d.match(seq) == (2, base + 3, False, 9)
    assert propose(d, seq, 4) == [9, 3, 4, 5]
    seq += [3]  # the generation joined the lines: it followed the reference
    assert propose(d, seq, 2) == [4, 5] and d.match(seq).position == 3  # (1, 2, 3) occurs only there
    seq += [4, 5, 6, 1, 2]
    assert d.match(seq) == (2, 2, False, 3)  # a tie again: now the reference wins it
    # The reference says 3, 4, 5 and ends; the latest [1, 2] of the sequence
    # says 3, 4, 5, 6.  The generation goes on with 6: it followed the sequence.
    seq += [3, 4, 5, 6]
    seq += [0, 1, 2]
    assert d.match(seq).position == base + 16  # so the sequence wins the next tie
    # A new reference (a changed prompt) drops a pending tie: nothing stale is
    # compared against the new texts.
    d.match(seq[:-1])
    assert d._contest is not None  # [1] occurs in both texts, followed by 2 in both
    d.set_reference([[0]])
    assert d._contest is None and propose(d, seq, 2) == [3, 4]
    d.begin(seq)
    assert not d._prefer_reference  # each generation starts from the sequence


def test_reference_changes_and_bad_reference():
    d = NgramDrafter(max_ngram=2)
    seq = [1, 2, 3, 1, 2]
    d.set_reference([[5, 6]])
    d.begin(seq)
    assert d.index.tokens == [5, 6, -1] + seq
    d.set_reference([[5, 6]])  # unchanged: the index is kept
    assert d.index.tokens == [5, 6, -1] + seq
    d.set_reference([[5, 7, 1, 2, 4]])
    assert propose(d, seq, 3) == [3, 1, 2]  # realigned; the sequence's own match still wins
    assert d.index.tokens == [5, 7, 1, 2, 4, -1] + seq
    d.rollback(3)
    assert d.index.tokens == [5, 7, 1, 2, 4, -1, 1, 2, 3]
    d.set_reference([])
    assert propose(d, [1, 2, 6, 1, 2], 3) == [6, 1, 2] and d.index.tokens == [1, 2, 6, 1, 2]
    with pytest.raises(ValueError, match="reference"):
        d.set_reference([[1, -3]])
    d.set_reference([[4, 4]])
    d.reset()
    assert d.reference == [] and d.index.tokens == []


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 2), max_size=60), cut=st.integers(0, 60))
def test_truncate_equals_rebuild(tokens, cut):
    idx = fresh_index(tokens, 3, 1)
    idx.truncate(cut)
    ref = fresh_index(tokens[:cut], 3, 1)
    assert idx.tokens == ref.tokens and idx._pos == ref._pos
    assert idx.find() == ref.find()


# ---------------------------------------------------------------- exactness

V = 5
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # every suffix has matches: n-gram drafts are frequent
CYCLE = {1: 2, 2: 3, 3: 1, 0: 4, 4: 0}


def cyclic_markov(seed: int, bias: float = 2.0, pass_seconds: float = 0.0) -> MarkovLM:
    """An order-2 model that tends to continue the cycle 1 → 2 → 3 → 1, so
    that copied continuations are often (not always) accepted."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 1.0, size=(V, V, V))
    for prev, nxt in CYCLE.items():
        table[:, prev, nxt] += bias
    return MarkovLM(V, order=2, table=table, pass_seconds=pass_seconds)


def joint_of_three(model: MarkovLM, params: SamplingParams) -> np.ndarray:
    joint = np.zeros((V, V, V))
    for a, b, c in itertools.product(range(V), repeat=3):
        joint[a, b, c] = (expected_distribution(model.row(PROMPT), params=params)[a]
                          * expected_distribution(model.row(PROMPT + [a]), params=params)[b]
                          * expected_distribution(model.row(PROMPT + [a, b]), params=params)[c])
    return joint


def sample_three(decoder, params, n, max_tokens=8):
    """Counts of the first three emitted tokens; longer generations let γ=5
    drafts happen at the first step."""
    counts = np.zeros((V, V, V))
    by_drafter: dict = {}
    for _ in range(n):
        gen = decoder.generate(PROMPT, max_tokens=max_tokens, params=params)
        counts[tuple(gen.tokens[:3])] += 1
        for name, (drafted, accepted) in gen.stats.by_drafter.items():
            tot = by_drafter.setdefault(name, [0, 0])
            tot[0] += drafted
            tot[1] += accepted
    return counts, by_drafter


EXACT_CASES = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)]


@pytest.mark.parametrize("gamma", [2, 5])
@pytest.mark.parametrize("params", EXACT_CASES, ids=lambda p: f"T{p.temperature}-p{p.top_p}")
def test_ngram_drafts_are_exact(params, gamma):
    target = cyclic_markov(seed=3)
    dec = SpeculativeDecoder(target, ByteTokenizer(), ngram=True, ngram_kwargs={"max_ngram": 3},
                             gamma=gamma, seed=100 + gamma)
    counts, by_drafter = sample_three(dec, params, 6000)
    assert_matches_distribution(counts, joint_of_three(target, params), what=f"n-gram γ={gamma} {params}")
    drafted, accepted = by_drafter["ngram"]
    assert 0 < accepted < drafted  # both verdicts were exercised
    assert set(by_drafter) == {"ngram"}


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_combined_drafts_are_exact(gamma):
    params = SamplingParams(temperature=0.9, top_p=0.95)
    # γ auto plans with measured pass times: a memory-bound pair (every target
    # pass 1 ms, a draft pass 0.1 ms), where both routes can pay.
    target = cyclic_markov(seed=5, pass_seconds=0.001 if gamma == "auto" else 0.0)
    draft = cyclic_markov(seed=6, bias=1.0, pass_seconds=0.0001 if gamma == "auto" else 0.0)
    dec = SpeculativeDecoder(target, ByteTokenizer(), draft, ngram=True,
                             ngram_kwargs={"max_ngram": 3, "min_ngram": 2}, gamma=gamma, gamma_max=8, seed=77)
    counts, by_drafter = sample_three(dec, params, 6000)
    assert_matches_distribution(counts, joint_of_three(target, params), what=f"combined γ={gamma}")
    assert by_drafter["ngram"][0] > 0 and by_drafter["model"][0] > 0  # both routes drafted


# ---------------------------------------------------------------- decoder behaviour


REPEAT_PROMPT = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]


@pytest.mark.parametrize("gamma", [1, 4, 8, "auto"])
def test_greedy_equals_plain(gamma):
    plain = SpeculativeDecoder(MarkovLM(12, order=2, seed=41), ByteTokenizer(), gamma=0)
    expected = plain.generate(REPEAT_PROMPT, max_tokens=50, params=GREEDY).tokens
    # A flat pass cost, so that γ = auto sees what speculation is worth.
    alone = SpeculativeDecoder(MarkovLM(12, order=2, seed=41, pass_seconds=0.002), ByteTokenizer(),
                               ngram=True, gamma=gamma, gamma_max=8)
    gen = alone.generate(REPEAT_PROMPT, max_tokens=50, params=GREEDY)
    assert gen.tokens == expected
    assert gen.stats.by_drafter["ngram"][1] > 0
    draft = MarkovLM(12, order=2, seed=42)
    combined = SpeculativeDecoder(MarkovLM(12, order=2, seed=41), ByteTokenizer(), draft, gamma=gamma, gamma_max=8,
                                  ngram=True, ngram_kwargs={"min_ngram": 3})
    gen = combined.generate(REPEAT_PROMPT, max_tokens=50, params=GREEDY)
    assert gen.tokens == expected
    # The draft model's cache stays a prefix of the sequence.
    held = combined._draft_lm.tokens(0)
    assert held == (REPEAT_PROMPT + gen.tokens)[:len(held)]
    # A second turn extending the first reuses the index.
    turn2 = REPEAT_PROMPT + gen.tokens + [7, 8]
    assert combined.generate(turn2, max_tokens=20, params=GREEDY).tokens == \
        plain.generate(turn2, max_tokens=20, params=GREEDY).tokens


class EmptyDrafter(NgramDrafter):
    """A lookup that finds matches but proposes nothing."""

    proposed = 0

    def propose(self, seq, gamma, params, rng):
        EmptyDrafter.proposed += 1
        return Draft(np.zeros(0, dtype=np.int32), None, 0.0, self.name)


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_empty_draft_is_a_plain_step(gamma, monkeypatch):
    import specdec_cpu.decoding.loop as loop

    monkeypatch.setattr(loop, "NgramDrafter", EmptyDrafter)
    params = SamplingParams(temperature=1.0)
    dec = SpeculativeDecoder(cyclic_markov(seed=3), ByteTokenizer(), ngram=True, gamma=gamma, seed=9)
    plain = SpeculativeDecoder(cyclic_markov(seed=3), ByteTokenizer(), gamma=0, seed=9)
    EmptyDrafter.proposed = 0
    for _ in range(3):
        gen = dec.generate(PROMPT, max_tokens=30, params=params)
        assert gen.tokens == plain.generate(PROMPT, max_tokens=30, params=params).tokens
        assert gen.stats.drafted == 0 and set(gen.stats.gammas) == {0} and gen.stats.steps == 30
        dec.reset()
        plain.reset()
    assert EmptyDrafter.proposed > 0


def test_lookup_drafts_are_free():
    """Prompt lookup costs nothing: γ=auto drafts with it where a draft model's
    (prior) cost is planned as well, and the model's cost estimate is its own.
    Passes take a flat 2 ms (0.2 ms for the draft): timed microsecond passes
    are noise that can make any verify look too dear to draft for."""
    params = SamplingParams(temperature=0.5, seed=8)
    draft = MarkovLM(V, seed=4, pass_seconds=0.0002)
    combined = SpeculativeDecoder(cyclic_markov(seed=3, pass_seconds=0.002), ByteTokenizer(), draft, gamma="auto",
                                  ngram=True)
    gen = combined.generate(PROMPT, max_tokens=60, params=params)
    assert gen.stats.by_drafter.get("ngram", [0])[0] > 0
    dec = SpeculativeDecoder(cyclic_markov(seed=3, pass_seconds=0.002), ByteTokenizer(), ngram=True, gamma="auto")
    gen = dec.generate(PROMPT, max_tokens=60, params=params)
    assert gen.stats.by_drafter["ngram"][0] > 0


# ---------------------------------------------------------------- GGUF models


TEXT = "def add(a, b):\n    return a + b\n\n" * 4 + "def add("


def test_from_gguf_ngram_alone(tiny_target):
    plain = SpeculativeDecoder.from_gguf(tiny_target, gamma=0, n_ctx=512, n_threads=1)
    dec = SpeculativeDecoder.from_gguf(tiny_target, ngram=True, gamma=4, n_ctx=512, n_threads=1,
                                       ngram_kwargs={"max_ngram": 3, "max_draft": 8})
    assert dec.ngram and dec.draft is None
    gen = dec.generate(TEXT, max_tokens=40, params=GREEDY)
    assert gen.tokens == plain.generate(TEXT, max_tokens=40, params=GREEDY).tokens
    assert gen.stats.by_drafter["ngram"][0] > 0
    gen = dec.generate(TEXT, max_tokens=20, params=SamplingParams(temperature=0.8, top_p=0.9), gamma="auto")
    assert len(gen.tokens) > 0


def test_from_gguf_combined(tiny_target, tiny_draft):
    plain = SpeculativeDecoder.from_gguf(tiny_target, gamma=0, n_ctx=512, n_threads=1)
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, ngram=True, gamma=3, n_ctx=512, n_threads=1)
    assert dec.ngram and dec.draft is not None
    for _ in range(2):  # the second call reuses both caches
        gen = dec.generate(TEXT, max_tokens=40, params=GREEDY)
        assert gen.tokens == plain.generate(TEXT, max_tokens=40, params=GREEDY).tokens
    assert sum(d for d, _ in gen.stats.by_drafter.values()) == gen.stats.drafted > 0
    gen = dec.generate(TEXT, max_tokens=20, params=SamplingParams(temperature=1.0), gamma="auto")
    assert len(gen.tokens) > 0


def test_from_gguf_ngram_kwargs_need_ngram(tiny_target):
    with pytest.raises(ValueError, match="ngram_kwargs"):
        SpeculativeDecoder.from_gguf(tiny_target, ngram_kwargs={"max_ngram": 2})
    with pytest.raises(ValueError, match="max_draft"):
        SpeculativeDecoder.from_gguf(tiny_target, ngram=True, ngram_kwargs={"max_draft": 0})

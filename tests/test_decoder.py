"""Mechanics of the decoder loop over synthetic models: caches, stops, stats."""

from __future__ import annotations

import threading

import pytest
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import ContextOverflowError, SamplingParams, SpeculativeDecoder

V = 8
T1 = SamplingParams(temperature=1.0, seed=99)


def make(gamma=3, eog=None, n_ctx=512, seed=0):
    target = MarkovLM(V, order=2, seed=1, n_ctx=n_ctx)
    draft = MarkovLM(V, order=2, seed=2, n_ctx=n_ctx)
    return SpeculativeDecoder(target, ByteTokenizer(eog=eog), draft, gamma=gamma, seed=seed), target, draft


def test_accepted_tokens_are_never_re_evaluated() -> None:
    dec, target, _ = make(gamma=4)
    prompt = [1, 2, 3, 4]
    gen = dec.generate(prompt, max_tokens=60, params=T1)
    s = gen.stats
    assert s.tokens == 60 and s.finish_reason == "length"
    # each step feeds the last emitted token plus its γ drafts, nothing else
    assert target.evaluated == len(prompt) - 1 + s.steps + s.drafted
    assert s.drafted == sum(s.gammas) and s.accepted <= s.drafted


def test_plain_decoding_feeds_one_token_per_step() -> None:
    dec, target, draft = make(gamma=0)
    gen = dec.generate([1, 2], max_tokens=20, params=T1)
    assert gen.stats.steps == 20 and gen.stats.drafted == 0
    assert target.evaluated == 1 + 20 and draft.evaluated == 0


def test_same_seed_same_output_and_streams_match_generate() -> None:
    dec, _, _ = make()
    a = dec.generate([1, 2], max_tokens=30, params=T1)
    pieces = list(dec.stream([1, 2], max_tokens=30, params=T1))
    assert "".join(pieces) == a.text and len(a.tokens) == 30
    fresh, _, _ = make(seed=123)
    assert fresh.generate([1, 2], max_tokens=30, params=T1).tokens == a.tokens


def test_closing_a_stream_leaves_the_decoder_consistent() -> None:
    dec, target, _ = make()
    stream = dec.stream([1, 2], max_tokens=50, params=T1)
    next(stream)
    next(stream)
    stream.close()
    assert target.n_past == len(dec._target_lm.tokens(0))
    again = dec.generate([5, 6, 7], max_tokens=25, params=T1)
    fresh, _, _ = make()
    assert again.tokens == fresh.generate([5, 6, 7], max_tokens=25, params=T1).tokens


def test_abandoned_stream_in_same_thread_does_not_deadlock() -> None:
    dec, _, _ = make()
    stream = dec.stream([1, 2], max_tokens=50, params=T1)
    next(stream)
    out = dec.generate([3, 4], max_tokens=5, params=T1)  # closes the suspended stream
    assert len(out.tokens) == 5
    with pytest.raises(StopIteration):
        next(stream)


def test_eog_stops_without_emitting_it() -> None:
    dec, _, _ = make(eog=0)
    gen = dec.generate([1, 2], max_tokens=400, params=T1)
    assert gen.finish_reason == "stop"
    assert 0 not in gen.tokens


def test_stop_string_is_never_shown_even_across_pieces() -> None:
    dec, _, _ = make()
    full = dec.generate([1, 2], max_tokens=80, params=T1).text
    stop = full[20:23]
    pieces = list(dec.stream([1, 2], max_tokens=80, params=T1, stop=[stop]))
    text = "".join(pieces)
    assert text == full[: full.index(stop)]
    assert stop not in text


def test_prompt_longer_than_context_is_rejected_cleanly() -> None:
    dec, target, _ = make(n_ctx=16)
    with pytest.raises(ContextOverflowError, match="17 tokens"):
        dec.generate(list(range(8)) * 2 + [1], max_tokens=4, params=T1)
    assert target.n_past == 0
    assert len(dec.generate([1, 2], max_tokens=4, params=T1).tokens) == 4


def test_generation_stops_when_context_is_full() -> None:
    dec, target, _ = make(n_ctx=20)
    gen = dec.generate([1, 2, 3], max_tokens=100, params=T1)
    assert gen.finish_reason == "context"
    assert 3 + len(gen.tokens) == 21  # the last token never needs a cache slot
    assert target.n_past <= 20


def test_chat_turns_reuse_the_cached_prefix() -> None:
    dec, target, _ = make()
    first = dec.generate([1, 2, 3, 4, 5, 6], max_tokens=10, params=T1)
    before = target.evaluated
    follow = [1, 2, 3, 4, 5, 6] + first.tokens + [7, 7]
    second = dec.generate(follow, max_tokens=5, params=T1)
    assert second.stats.prompt_cached >= 6 + len(first.tokens) - 1
    s = second.stats
    assert target.evaluated - before == (len(follow) - 1 - s.prompt_cached) + s.steps + s.drafted


@pytest.mark.parametrize("bad", [-1, 65, 1.5, "fast", True])
def test_gamma_out_of_range(bad) -> None:
    with pytest.raises(ValueError, match="gamma"):
        make(gamma=bad)


def test_bad_arguments() -> None:
    dec, _, _ = make()
    with pytest.raises(ValueError, match="prompt is empty"):
        dec.generate("", max_tokens=3)
    with pytest.raises(ValueError, match="max_tokens"):
        dec.generate([1], max_tokens=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dec.generate([1, 99], max_tokens=3)
    with pytest.raises(TypeError, match="SamplingParams"):
        dec.generate([1], params={"temperature": 1})
    for stop in (5, b"x"):
        with pytest.raises(TypeError, match="stop must be a str, a sequence of str or None"):
            dec.generate([1], max_tokens=3, stop=stop)
    with pytest.raises(ValueError, match="stop strings must be non-empty str, got ''"):
        dec.generate([1], max_tokens=3, stop=["a", ""])
    assert dec.generate([1], max_tokens=3, stop=None).tokens  # None: no stop strings, as in OpenAI's API


def test_cancel_event_stops_within_a_step() -> None:
    dec, _, _ = make()
    cancel = threading.Event()
    stream = dec.stream([1, 2], max_tokens=200, params=T1, cancel=cancel)
    next(stream)
    cancel.set()
    rest = list(stream)
    assert len("".join(rest)) <= dec.gamma_max + 1


def test_stats_are_consistent() -> None:
    dec, _, _ = make(gamma=3)
    s = dec.generate([1, 2], max_tokens=40, params=T1).stats
    assert s.tokens == 40
    assert s.tokens_per_step == pytest.approx(40 / s.steps)
    assert 0 < s.mean_alpha <= 1 and 0 <= s.acceptance <= 1
    assert s.by_drafter["model"] == [s.drafted, s.accepted]
    d = s.to_dict()
    assert d["tokens"] == 40 and "tokens_per_second" in d


class RowCostLM(MarkovLM):
    """A Markov model whose pass takes ``base + per_row · rows`` seconds."""

    def __init__(self, *args, base: float, per_row: float, cold: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.base, self.per_row, self.cold = base, per_row, cold  # cold: extra seconds of the first pass

    def eval(self, tokens, n_logits=1):
        import time

        time.sleep(self.base + self.per_row * len(tokens) + self.cold)
        self.cold = 0.0
        return super().eval(tokens, n_logits)


def test_a_first_generation_plans_with_costs_it_measured() -> None:
    """No calibration: the first step measures T(1) (plain) and one draft row;
    from then on the γ choices come from measured costs.  A memory-bound pair
    (rows nearly free, a cheap draft) drafts long from the third step on; a
    compute-bound one (every row a pass's worth, a draft costing 0.7 of a
    target pass) never drafts, not even to explore its unmeasured acceptance."""
    prompt = [1, 2, 3, 1, 2, 3, 4]

    def first_generation(target_kw, draft_kw):
        target = RowCostLM(V, order=2, seed=1, **target_kw)
        draft = RowCostLM(V, order=2, table=target.table, **draft_kw)  # accepted every time
        dec = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma="auto", seed=0)
        assert dec.cost_model is None and not dec.policy.planner.target.known(1)
        gen = dec.generate(prompt, max_tokens=40, params=T1)
        planner = dec.policy.planner
        assert planner.target.last_seen(1) > 0 and planner.draft.last_seen(1) > 0  # measured, not seeded
        return gen.stats.gammas

    memory = first_generation(dict(base=0.010, per_row=0.0002), dict(base=0.001, per_row=0.0005))
    assert memory[0] == 0 and min(memory[2:5]) >= 2 and max(memory) >= 6, memory
    compute = first_generation(dict(base=0.002, per_row=0.010), dict(base=0.001, per_row=0.007))
    assert set(compute) == {0}, compute


def test_a_cold_first_draft_pass_does_not_stop_drafting() -> None:
    """The draft's first pass pays for weights not yet in the page cache (a
    0.5B draft's first pass has taken 40x its later ones): its second
    reading replaces it, so a memory-bound pair drafts from the third step
    on instead of judging the draft 40 times too slow."""
    target = RowCostLM(V, order=2, seed=1, base=0.010, per_row=0.0002)
    draft = RowCostLM(V, order=2, table=target.table, base=0.001, per_row=0.0005, cold=0.060)
    dec = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma="auto", seed=0)

    gammas = dec.generate([1, 2, 3, 1, 2, 3, 4], max_tokens=40, params=T1).stats.gammas
    times = dec.policy.planner.draft
    assert times.settled(1) and times.time(1) < 0.010 * 1000, times.time(1)
    assert gammas[:2] == [0, 0] and max(gammas[2:6]) >= 2, gammas


def test_a_cold_first_prompt_pass_does_not_stop_drafting() -> None:
    """The prompt's pass is a process's first: it may pay for weights not yet
    in the page cache or a first call's setup (one took 2.5 s against 0.44 s
    warm).  The verify-sized rows at the end of the prompt then go in as a
    pass of their own, which times the counts drafting would use warm, so a
    memory-bound pair drafts within a few steps instead of reading a
    verify of k rows off a cold slope, and a compute-bound one still never
    drafts."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 0] * 5

    def first_generation(target_kw, draft_kw):
        target = RowCostLM(V, order=2, seed=1, cold=0.4, **target_kw)
        draft = RowCostLM(V, order=2, table=target.table, **draft_kw)  # accepted every time
        dec = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma="auto", seed=0)
        return dec.generate(prompt, max_tokens=40, params=T1).stats.gammas

    memory = first_generation(dict(base=0.010, per_row=0.0002), dict(base=0.001, per_row=0.0005))
    assert max(memory[:6]) >= 2 and max(memory) >= 6, memory
    compute = first_generation(dict(base=0.002, per_row=0.010), dict(base=0.001, per_row=0.007))
    assert set(compute) == {0}, compute


def test_pass_times_settle_on_the_lower_of_two_first_readings() -> None:
    from specdec_cpu.planning.pass_times import PassTimes

    cold = PassTimes(8)
    cold.observe(1, 977.0)
    assert not cold.settled(1) and cold.time(1) == 977.0
    cold.observe(1, 22.0)
    assert cold.settled(1) and cold.time(1) == 22.0  # in full, not 977 + 0.2 · (22 − 977)
    cold.observe(1, 30.0)
    assert cold.time(1) == pytest.approx(22.0 + 0.2 * 8.0)  # then the moving average
    warm = PassTimes(8)
    warm.observe(1, 22.0)
    warm.observe(1, 30.0)
    assert warm.time(1) == 22.0
    assert PassTimes(8, [5.0]).settled(1)  # a calibration's seed is settled

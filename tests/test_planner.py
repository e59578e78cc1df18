"""Cost model, its cache, calibration (with fake models) and the γ controller."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Optional, Sequence

import numpy as np
import pytest

from specdec_cpu.planning import theory
from specdec_cpu.params import SamplingParams
from specdec_cpu.planning import (
    CostModel,
    GammaController,
    ModelIdentity,
    cache_dir,
    calibrate,
    calibration_key,
    calibration_path,
    cpu_model,
    time_passes,
)
from specdec_cpu.planning.calibration import DRAFT_LOGIT_ROWS

# docs/math.md §8 curves (ms per decode call over k rows, all rows' logits).
KS = [1, 2, 4, 6, 8, 16]
Q4KM = np.interp(np.arange(1, 18), KS, [20.3, 37.1, 49.0, 73.8, 82.3, 126.0])  # compute-bound
F32 = np.interp(np.arange(1, 18), KS, [64.8, 69.7, 78.8, 85.9, 104.0, 156.0])  # memory-bound


# ================================================================== CostModel

def make_model(**kw) -> CostModel:
    base = dict(target_ms=[20.0, 30.0, 40.0], draft_ms=5.0, alpha=0.8, n_threads=2, cpu="Test CPU",
                target=ModelIdentity("/m/t.gguf", 100, 1.5), draft=ModelIdentity("/m/d.gguf", 10, 2.5),
                sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0})
    base.update(kw)
    return CostModel(**base)


def test_costs_and_verify_curve():
    m = make_model()
    assert m.cost == pytest.approx(0.25)
    assert [m.verify_cost(k) for k in (1, 2, 3)] == pytest.approx([1.0, 1.5, 2.0])
    # Beyond K: continued linearly with the least-squares slope (10 ms per row).
    assert m.target_time(5) == pytest.approx(60.0)
    v = m.verify_curve(5)
    assert np.isnan(v[0]) and v[1] == 1.0 and v[5] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="k"):
        m.verify_cost(0)


def test_extrapolation_never_decreases():
    m = make_model(target_ms=[30.0, 28.0, 26.0, 24.0])  # a falling (noisy) curve
    assert m.target_time(6) == pytest.approx(24.0)
    single = make_model(target_ms=[20.0])
    assert single.verify_cost(4) == 1.0


def test_speedup_and_gamma_via_theory():
    m = make_model(target_ms=list(Q4KM), draft_ms=0.25 * Q4KM[0], alpha=0.7)
    assert m.optimal_gamma(12) == 0
    assert m.speedup(0) == 1.0
    assert m.speedup(3) == pytest.approx(theory.speedup(0.7, 3, 0.25, Q4KM[3] / Q4KM[0]))
    flat = make_model(target_ms=[50.0] * 13, draft_ms=5.0, alpha=0.8)
    assert flat.optimal_gamma(12) == 6  # the seed's example: c = 0.1, v = 1
    assert len(flat.plan(12)) == 13
    with pytest.raises(ValueError, match="alpha"):
        make_model(alpha=None).optimal_gamma()


@pytest.mark.parametrize("bad", [dict(target_ms=[]), dict(target_ms=[0.0]), dict(draft_ms=-1.0),
                                 dict(alpha=1.5), dict(target_ms=[1.0, float("nan")])])
def test_invalid_cost_models(bad):
    with pytest.raises(ValueError):
        make_model(**bad)


def test_json_round_trip(tmp_path):
    m = make_model()
    again = CostModel.from_json(m.to_json())
    assert again == m
    path = m.save(tmp_path / "sub" / "cal.json")
    assert CostModel.load(path) == m
    assert [p.name for p in path.parent.iterdir()] == ["cal.json"]  # no temp file left
    # Extra keys (e.g. `calibrate --json` output) are ignored.
    data = json.loads(m.to_json())
    data["derived"] = {"cost": 0.25}
    assert CostModel.from_dict(data) == m


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"draft_ms": 1.0}))
    with pytest.raises(ValueError, match="target_ms"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"format": 99, "target_ms": [1.0], "draft_ms": 1.0}))
    with pytest.raises(ValueError, match="format"):
        CostModel.load(bad)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SPECDEC_CACHE_DIR")
    assert cache_dir() == tmp_path / "x" / "specdec-cpu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_dir() == tmp_path / "h" / ".cache" / "specdec-cpu"
    monkeypatch.delenv("SPECDEC_CALIBRATION_DIR", raising=False)
    assert calibration_path("abc") == tmp_path / "h" / ".cache" / "specdec-cpu" / "calibration" / "abc.json"
    monkeypatch.setenv("SPECDEC_CALIBRATION_DIR", str(tmp_path / "c"))
    assert calibration_path("abc") == tmp_path / "c" / "abc.json"


def test_cache_key(tmp_path):
    f = tmp_path / "t.gguf"
    f.write_bytes(b"1234")
    ident = ModelIdentity.of(f)
    assert ident.size == 4 and os.path.isabs(ident.path)
    d = ModelIdentity("/d", 1, 1.0)
    key = calibration_key(ident, d, 2, "cpu")
    assert key == calibration_key(ModelIdentity.of(f), d, 2, "cpu")
    assert key == make_model(target=ident, draft=d, n_threads=2, cpu="cpu").key
    others = {
        calibration_key(ident, d, 4, "cpu"),
        calibration_key(ident, d, 2, "other cpu"),
        calibration_key(ident, None, 2, "cpu"),
        calibration_key(ModelIdentity(ident.path, 5, ident.mtime), d, 2, "cpu"),
        calibration_key(ModelIdentity(ident.path, 4, ident.mtime + 1), d, 2, "cpu"),
    }
    assert key not in others and len(others) == 5


def test_cpu_model():
    name = cpu_model()
    assert isinstance(name, str) and name


# ================================================================== calibrate, with fake models

class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLM:
    """A CausalLM whose eval advances a fake clock by T(k) and counts calls."""

    def __init__(self, clock: FakeClock, ms_per_k, n_vocab: int = 1000, n_ctx: int = 256) -> None:
        self.clock, self.ms_per_k = clock, ms_per_k
        self.n_vocab, self.n_ctx = n_vocab, n_ctx
        self.tokens: list[int] = []
        self.calls: list[tuple[int, int]] = []

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        assert all(0 <= t < self.n_vocab for t in tokens)
        assert len(self.tokens) + len(tokens) <= self.n_ctx
        self.calls.append((len(tokens), n_logits))
        self.tokens.extend(tokens)
        self.clock.now += self.ms_per_k(len(tokens)) / 1000.0
        return np.zeros((n_logits, self.n_vocab), dtype=np.float32)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


class FakeDecoder:
    def __init__(self, tmp_path, clock: FakeClock, alphas=(0.8, 0.9, 0.7, 0.8)) -> None:
        self.target = FakeLM(clock, lambda k: 10.0 + 5.0 * (k - 1))
        self.draft = FakeLM(clock, lambda k: 2.0 * k)
        for name in ("t.gguf", "d.gguf"):
            (tmp_path / name).write_bytes(name.encode())
        self.target_path, self.draft_path = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
        self.n_threads = 2
        self.alphas = list(alphas)
        self.generated: list[tuple[str, int, SamplingParams, Optional[int]]] = []

    def generate(self, prompt, *, max_tokens, params, gamma=None):
        self.generated.append((prompt, max_tokens, params, gamma))
        a = self.alphas[(len(self.generated) - 1) % len(self.alphas)]
        return SimpleNamespace(stats=SimpleNamespace(mean_alpha=a, alpha_rows=10))


@pytest.fixture
def cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_calibrate_measures_the_fake_costs(tmp_path, cache_env):
    clock = FakeClock()
    dec = FakeDecoder(tmp_path, clock)
    dec.target.tokens = [1, 2, 3]  # a conversation already in the cache
    params = SamplingParams(temperature=0.7, top_k=40, seed=5)
    m = calibrate(dec, params=params, gamma_max=4, clock=clock)
    assert m.target_ms == pytest.approx([10.0, 15.0, 20.0, 25.0, 30.0])
    assert m.draft_ms == pytest.approx(2.0)
    assert m.cost == pytest.approx(0.2)
    assert m.alpha == pytest.approx(0.8)
    assert m.n_threads == 2 and m.cpu == cpu_model()
    assert m.target == ModelIdentity.of(dec.target_path)
    assert m.sampling == {"temperature": 0.7, "top_k": 40, "top_p": 1.0, "min_p": 0.0}
    # Every timed pass asks for all k rows' logits, and the caches are restored.
    assert (5, 5) in dec.target.calls and (3, 3) in dec.target.calls
    assert dec.target.tokens == [1, 2, 3] and dec.draft.tokens == []
    # α: short generations at γ = 4 on the built-in prompts.
    assert len(dec.generated) == 4 and all(g[3] == 4 and g[1] == 32 for g in dec.generated)
    assert calibration_path(m.key).is_file()


def test_calibrate_uses_the_cache(tmp_path, cache_env):
    clock = FakeClock()
    dec = FakeDecoder(tmp_path, clock)
    first = calibrate(dec, gamma_max=4, clock=clock)
    dec.target.calls.clear()
    dec.generated.clear()
    again = calibrate(dec, gamma_max=4, clock=clock)
    assert again == first and not dec.target.calls and not dec.generated
    # Other sampling settings: timings are reused, only α is measured again.
    dec.alphas = [0.5]
    other = calibrate(dec, params=SamplingParams(temperature=0.3), gamma_max=4, clock=clock)
    assert not dec.target.calls and len(dec.generated) == 4
    assert other.alpha == pytest.approx(0.5) and other.target_ms == first.target_ms
    # --recalibrate measures everything again.
    calibrate(dec, gamma_max=4, recalibrate=True, clock=clock)
    assert dec.target.calls
    # A larger gamma_max than cached needs new timings.
    dec.target.calls.clear()
    bigger = calibrate(dec, gamma_max=6, clock=clock)
    assert dec.target.calls and bigger.k_max == 7


def test_calibrate_survives_a_corrupt_cache_and_can_skip_it(tmp_path, cache_env):
    clock = FakeClock()
    dec = FakeDecoder(tmp_path, clock)
    m = calibrate(dec, gamma_max=2, clock=clock)
    path = calibration_path(m.key)
    path.write_text("garbage")
    dec.target.calls.clear()
    assert calibrate(dec, gamma_max=2, clock=clock).target_ms == pytest.approx(m.target_ms)
    assert dec.target.calls
    path.unlink()
    calibrate(dec, gamma_max=2, cache=False, clock=clock)
    assert not path.exists()


def test_calibrate_key_follows_the_model_file(tmp_path, cache_env):
    clock = FakeClock()
    dec = FakeDecoder(tmp_path, clock)
    m1 = calibrate(dec, gamma_max=2, clock=clock)
    (tmp_path / "t.gguf").write_bytes(b"a different, longer model file")
    m2 = calibrate(dec, gamma_max=2, clock=clock)
    assert m1.key != m2.key


def test_the_draft_is_timed_as_it_runs_one_logits_row_per_request_and_none_for_catch_ups(tmp_path, cache_env):
    """A draft pass returns a logits row per request drafting (DRAFT_LOGIT_ROWS
    or fewer); its larger passes are catch-ups, which need the last row's only:
    timed with every row's, they cost ~1.6x more on the default draft and the
    planner priced catch-ups that much too high.  The target's passes are
    verifies, every row's logits needed."""
    clock = FakeClock()
    dec = FakeDecoder(tmp_path, clock)
    calibrate(dec, gamma_max=2, batch=64, clock=clock)
    draft = {k: n for k, n in dec.draft.calls if k > 1}
    assert draft and max(draft) == 64
    assert all(n == (k if k <= DRAFT_LOGIT_ROWS else 1) for k, n in draft.items())
    assert any(k > DRAFT_LOGIT_ROWS for k in draft) and any(1 < k <= DRAFT_LOGIT_ROWS for k in draft)
    assert all(n == k for k, n in dec.target.calls[2:] if k > 1)  # after the warm context


def test_time_passes_takes_the_median(tmp_path):
    clock = FakeClock()
    slow_once = {"done": False}

    def ms(k):
        if k == 2 and not slow_once["done"] and len(lm.calls) > 3:
            slow_once["done"] = True
            return 500.0  # one pass hit by another process
        return 10.0 * k

    lm = FakeLM(clock, ms)
    assert time_passes(lm, [1, 2, 3], repeats=3, clock=clock) == pytest.approx([10.0, 20.0, 30.0])
    with pytest.raises(ValueError, match="context"):
        time_passes(FakeLM(clock, ms, n_ctx=4), [1, 2, 3, 4], clock=clock)


# ================================================================== GammaController

def cost_model(curve, c, alpha=None, k=13) -> CostModel:
    return CostModel(target_ms=list(curve[:k]), draft_ms=c * curve[0], alpha=alpha)


def plain_step(ctl, t_ms):
    ctl.observe(0, [], 0, 0.0, t_ms / 1000)


def spec_step(ctl, g, alpha, curve, c, rng=None):
    if rng is None:
        n_acc = g
    else:
        acc = rng.random(g) < alpha
        n_acc = g if acc.all() else int(np.argmin(acc))
    ctl.observe(g, [alpha] * g, n_acc, g * c * curve[0] / 1000, curve[g] / 1000)
    return n_acc


def test_flat_verify_cost_gives_a_large_gamma():
    ctl = GammaController(cost_model(np.full(17, 50.0), 0.05, alpha=0.9), gamma_max=12)
    assert ctl.next_gamma() >= 8


def test_steep_verify_cost_gives_plain_decoding():
    ctl = GammaController(cost_model(Q4KM, 0.25, alpha=0.7), gamma_max=12)
    assert ctl.next_gamma() == 0
    for _ in range(20):
        assert ctl.next_gamma() == 0
        plain_step(ctl, Q4KM[0])


def test_probes_bring_gamma_back_after_a_content_change():
    rng = np.random.default_rng(0)
    ctl = GammaController(cost_model(Q4KM, 0.25), gamma_max=12)
    c = 0.25
    # Low-acceptance content: plain decoding with rare, backing-off probes.
    for _ in range(400):
        g = ctl.next_gamma()
        if g == 0:
            plain_step(ctl, Q4KM[0])
        else:
            assert g == ctl.probe_gamma
            spec_step(ctl, g, 0.5, Q4KM, c, rng)
    probes = sum(1 for g in ctl.history if g > 0)
    assert 0 < probes <= 8
    # The content turns repetitive (α = 0.97): speculation pays even here.
    assert theory.optimal_gamma(0.97, c, 12, cost_model(Q4KM, c).verify_curve(13)) > 0
    turned_on = None
    for step in range(600):
        g = ctl.next_gamma()
        if g == 0:
            plain_step(ctl, Q4KM[0])
        else:
            spec_step(ctl, g, 0.97, Q4KM, c, rng)
            if g > ctl.probe_gamma:
                turned_on = step
                break
    assert turned_on is not None and turned_on <= ctl.probe_max + 20
    assert ctl.alpha > 0.85


def test_without_a_cost_model_it_measures_plain_first_then_learns():
    ctl = GammaController(None, gamma_max=12)
    assert ctl.next_gamma() == 0  # warm-up: T(1) is unknown
    plain_step(ctl, F32[0])
    assert ctl.next_gamma() == 0
    plain_step(ctl, F32[0])
    g = ctl.next_gamma()
    assert g > 0
    for _ in range(300):
        g = ctl.next_gamma()
        if g == 0:
            plain_step(ctl, F32[0])
        else:
            spec_step(ctl, g, 0.95, F32, 0.1)
    g = ctl.next_gamma()
    assert g >= 6
    assert ctl.cost == pytest.approx(0.1, rel=0.05)
    # The verify cost at the γ it settled on is the measured one, not the prior.
    assert ctl.verify_curve()[g + 1] == pytest.approx(F32[g] / F32[0], rel=0.05)


def test_a_guessed_acceptance_is_replaced_by_the_first_rows():
    """A fresh decoder's α̂ is a guess (0.7): the first drafted rows replace it
    by their running mean, so γ reaches what the real α asks for within a few
    steps; moving the guess by the EMA weight per row took ~20 rows."""
    best = GammaController(cost_model(F32, 0.2, alpha=0.95))._choose()
    ctl = GammaController(cost_model(F32, 0.2))
    assert ctl.next_gamma() < best  # planned on the guess
    gammas = []
    for _ in range(4):
        g = ctl.next_gamma()
        gammas.append(g)
        spec_step(ctl, g, 0.95, F32, 0.2)
    assert gammas[-1] == best, gammas
    assert ctl.alpha_first > 0.85  # (0.7 + 4 × 0.95) / 5 = 0.9; the EMA weight alone leaves 0.79
    # A measured α counts as 20 rows: a row moves it at the EMA rate from the start.
    known = GammaController(cost_model(F32, 0.2, alpha=0.95))
    spec_step(known, 2, 0.3, F32, 0.2)
    assert known.alpha_first == pytest.approx(0.95 + known.ema * (0.3 - 0.95))


def test_a_guessed_acceptance_is_probed_at_once():
    """Where the guess says plain decoding, the first step probes anyway (a
    good pair would otherwise wait ``probe_every`` steps to be found out);
    once rows are in, probes back off as usual.  A measured α is trusted."""
    ctl = GammaController(cost_model(Q4KM, 0.25), gamma_max=12, probe_every=8)
    assert ctl._choose() == 0
    assert ctl.next_gamma() == ctl.probe_gamma
    spec_step(ctl, ctl.probe_gamma, 0.3, Q4KM, 0.25)
    seen = []
    for _ in range(8):
        seen.append(ctl.next_gamma())
        plain_step(ctl, Q4KM[0])
    assert seen == [0] * 8
    measured = GammaController(cost_model(Q4KM, 0.25, alpha=0.7), gamma_max=12, probe_every=8)
    assert measured.next_gamma() == 0


def simulate(ctl, curve, c, alpha, steps, rng, fixed=None):
    """Tokens per ms of a synthetic pair (per-row α from a Beta around ``alpha``)."""
    tokens, ms = 0, 0.0
    d = c * curve[0]
    for _ in range(steps):
        g = ctl.next_gamma() if fixed is None else fixed
        if g == 0:
            if ctl is not None:
                plain_step(ctl, curve[0])
            tokens, ms = tokens + 1, ms + curve[0]
            continue
        rows = rng.beta(alpha * 4, (1 - alpha) * 4, size=g)
        acc = rng.random(g) < rows
        n_acc = g if acc.all() else int(np.argmin(acc))
        if ctl is not None:
            ctl.observe(g, rows.tolist(), n_acc, g * d / 1000, curve[g] / 1000)
        tokens, ms = tokens + n_acc + 1, ms + curve[g] + g * d
    return tokens / ms


@pytest.mark.parametrize("with_model", [True, False])
def test_never_slower_than_plain_on_a_compute_bound_pair(with_model):
    rng = np.random.default_rng(1)
    ctl = GammaController(cost_model(Q4KM, 0.25) if with_model else None)
    rate = simulate(ctl, Q4KM, 0.25, 0.7, 2000, rng)
    assert rate * Q4KM[0] >= 0.97


@pytest.mark.parametrize("with_model", [True, False])
def test_close_to_the_best_fixed_gamma_on_a_memory_bound_pair(with_model):
    rng = np.random.default_rng(2)
    ctl = GammaController(cost_model(F32, 0.2) if with_model else None)
    auto = simulate(ctl, F32, 0.2, 0.9, 3000, rng)
    best = max(simulate(None, F32, 0.2, 0.9, 3000, rng, fixed=g) for g in (2, 4, 6, 8))
    assert auto >= 0.95 * best


def test_observe_falls_back_to_accept_counts_and_skips_catch_up_draft_time():
    ctl = GammaController(cost_model(F32, 0.2, alpha=0.5), ema=0.5)
    ctl.observe(4, [], 4, 100.0, F32[4] / 1000)  # first draft of a sequence: includes its prompt
    assert ctl.cost == pytest.approx(0.2)
    assert ctl.alpha == pytest.approx(0.5 + 0.5 * 0.5 + 0.25 * 0.5 + 0.125 * 0.5 + 0.0625 * 0.5)
    ctl.observe(4, [], 1, 4 * 0.2 * F32[0] / 1000, F32[4] / 1000)  # one accepted, then rejected
    assert ctl.cost == pytest.approx(0.2)
    ctl.new_sequence()
    ctl.observe(4, [0.9] * 4, 4, 50.0, F32[4] / 1000)
    assert ctl.cost == pytest.approx(0.2)


def test_a_single_wild_timing_moves_estimates_only_a_little():
    ctl = GammaController(cost_model(F32, 0.2, alpha=0.9))
    before = ctl.verify_curve()[5]
    ctl.observe(4, [0.9] * 4, 4, 4 * 0.2 * F32[0] / 1000, 100 * F32[4] / 1000)
    assert ctl.verify_curve()[5] <= before * (1 + 2 * ctl.time_ema) + 1e-9


def test_history_and_estimates():
    ctl = GammaController(cost_model(np.full(17, 50.0), 0.05, alpha=0.9), gamma_max=6)
    for _ in range(3):
        g = ctl.next_gamma()
        spec_step(ctl, g, 0.9, np.full(17, 50.0), 0.05)
    plain_step(ctl, 50.0)
    assert ctl.gamma_runs() == [(6, 3), (0, 1)]
    assert ctl.gamma_counts == {6: 3, 0: 1} and ctl.steps == 4
    est = ctl.estimates()
    assert set(est) >= {"alpha", "cost", "verify_cost", "best_gamma"}
    assert len(est["verify_cost"]) == 7 and est["verify_cost"][0] == 1.0
    assert ctl.predicted_speedup(0) == 1.0


def test_gamma_max_zero_never_speculates():
    ctl = GammaController(cost_model(np.full(17, 50.0), 0.01, alpha=0.99), gamma_max=0)
    for _ in range(100):
        assert ctl.next_gamma() == 0
        plain_step(ctl, 50.0)


def test_a_probe_cut_short_is_retried():
    ctl = GammaController(cost_model(Q4KM, 0.25, alpha=0.7), probe_every=4)
    seen = []
    for _ in range(6):
        seen.append(ctl.next_gamma())
        plain_step(ctl, Q4KM[0])  # the decoder ran plain decoding whatever was asked
    assert seen[4] == ctl.probe_gamma and seen[5] == ctl.probe_gamma


@pytest.mark.parametrize("kw", [dict(gamma_max=-1), dict(ema=0.0), dict(alpha_prior=2.0),
                                dict(probe_every=0), dict(probe_gamma=0), dict(min_speedup=0.0),
                                dict(prior_rows=-1.0), dict(prior_rows=float("nan"))])
def test_controller_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        GammaController(None, **kw)


@pytest.mark.parametrize("alpha,c,slope", [(0.9, 0.05, 0.0), (0.8, 0.1, 0.1), (0.7, 0.25, 0.8),
                                           (0.97, 0.2, 0.4), (0.5, 0.0, 0.0)])
def test_controller_choice_agrees_with_theory(alpha, c, slope):
    curve = 20.0 * (1.0 + slope * np.arange(17))
    ctl = GammaController(cost_model(curve, c, alpha=alpha), gamma_max=12, min_speedup=1.0)
    expected = theory.optimal_gamma(alpha, c, 12, ctl.verify_curve())
    assert ctl.next_gamma() == expected


def test_pass_times_follow_the_machine_load() -> None:
    """T̂(1) measured on a busy machine must not stay inflated while the
    controller speculates (it would make drafting look cheaper than it is)."""
    from specdec_cpu.planning.controller import GammaController

    def t_pass(k: int, load: float) -> float:  # seconds; memory-bound shape
        return load * 0.030 * (1.0 + 0.08 * (k - 1))

    ctrl = GammaController(None, gamma_max=6, warmup=0)
    for _ in range(3):
        ctrl.observe(0, (), 0, None, t_pass(1, load=3.0))  # busy: T(1) = 90 ms
    for _ in range(400):  # the load goes away
        g = ctrl.next_gamma()
        ctrl.observe(g, (0.9,) * g, g, 0.004 * g if g else None, t_pass(g + 1, load=1.0))
    assert ctrl._curve()[1] == pytest.approx(30.0, rel=0.1)
    assert ctrl.cost == pytest.approx(4.0 / 30.0, rel=0.15)
    assert ctrl.gamma_counts[0] - 3 <= 0.02 * 400  # refreshing T(1) costs few plain steps


def test_no_probes_where_even_perfect_acceptance_cannot_pay() -> None:
    """Compute-bound target with a costly draft (docs/math.md §8's Q4_K_M curve, c = 0.68):
    a probe would only cost the draft's catch-up, so none are made."""
    from specdec_cpu.planning.controller import GammaController

    steep = [1.0, 1.0, 1.76, 2.23, 2.41, 3.34, 3.60, 3.84, 3.92, 4.88]  # index k
    ctrl = GammaController(None, gamma_max=8, warmup=0, probe_every=4)
    for k in range(1, 10):  # costs measured, e.g. by earlier steps
        ctrl.observe(k - 1, (0.95,) * (k - 1), k - 1, 0.0136 * (k - 1) or None, 0.020 * steep[k])
    choices = []
    for _ in range(100):
        g = ctrl.next_gamma()
        choices.append(g)
        ctrl.observe(g, (0.95,) * g, g, 0.0136 * g or None, 0.020 * steep[g + 1])
    assert set(choices) == {0}


def test_correlated_acceptance_earns_longer_drafts() -> None:
    """A drafter whose later tokens are accepted whenever the first one is
    (an n-gram continuation of copied text) gets longer drafts than an i.i.d.
    drafter that is accepted more often on its first token."""
    from specdec_cpu.planning.controller import GammaController

    def run(rows_of) -> int:
        ctrl = GammaController(None, gamma_max=12, warmup=0, cost_prior=0.0)
        for _ in range(300):
            g = ctrl.next_gamma()
            rows = rows_of(g)
            ctrl.observe(g, rows, 0, 1e-6 if g else None, 0.050 * (1 + 0.05 * g))
        return ctrl.next_gamma()

    # first row accepted half the time; once it is, the rest almost surely are
    correlated = run(lambda g: [0.5] + [0.98] * (g - 1) if g else [])
    iid = run(lambda g: [0.62] * g)
    assert correlated > iid >= 1


def test_a_new_generation_starts_the_probe_back_off_over() -> None:
    """Failed probes space out (up to probe_max) within a generation; the
    next generation may hold other content, so its first probe comes after
    probe_every plain steps again."""
    ctl = GammaController(cost_model(F32, 0.2, alpha=0.05), gamma_max=12, probe_every=4, probe_max=64)

    def steps(n):
        drafted = []
        for _ in range(n):
            g = ctl.next_gamma()
            if g:
                drafted.append(g)
                ctl.observe(g, [0.0] * g, 0, g * 0.2 * F32[0] / 1000, F32[g] / 1000)
            else:
                plain_step(ctl, F32[0])
        return drafted

    steps(600)
    assert ctl._probe_interval == 64 and not steps(40)  # backed off
    ctl.new_sequence()
    assert steps(6)  # probes again within probe_every + 1 steps

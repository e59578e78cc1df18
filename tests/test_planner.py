"""Cost model, its cache, and calibration (with fake models).  The draft policy: test_policy.py."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Optional, Sequence

import numpy as np
import pytest

from specdec_cpu.params import SamplingParams
from specdec_cpu.planning import (
    CostModel,
    ModelIdentity,
    cache_dir,
    calibrate,
    calibration_key,
    calibration_path,
    cpu_model,
    theory,
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

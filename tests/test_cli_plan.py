"""`specdec-cpu plan` and `specdec-cpu calibrate` through main(argv)."""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specdec_cpu.cli import main
from specdec_cpu.cli._common import emit
from specdec_cpu.planning.costmodel import CostModel


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[list[str]]:
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and len(parts) >= 4 and parts[2].endswith("×"):
            rows.append(parts)
    return rows


# ------------------------------------------------------------------ plan

def test_plan_seed_example(capsys):
    code, out, err = run(capsys, "plan", "--alpha", "0.8", "--cost", "0.1")
    assert code == 0 and err == ""
    rows = table_rows(out)
    assert [int(r[0]) for r in rows] == list(range(13))
    star = [line for line in out.splitlines() if "←" in line]
    assert len(star) == 1 and star[0].split()[:3] == ["6", "3.951", "2.470×"]
    assert "γ* = 6" in star[0] and "100.0%" in star[0]
    assert "continuous optimum: γ ≈ 5.76" in out
    assert "ceiling: 1/(1 − α) = 5.00" in out
    # every γ in 4..8 within 3% of the best
    assert all(float(r[3].rstrip("%")) >= 97.0 for r in rows[4:9])


def test_plan_other_seed_rows(capsys):
    code, out, _ = run(capsys, "plan", "--alpha", "0.6", "--cost", "0.1", "--gamma-max", "8")
    assert code == 0
    star = next(line for line in out.splitlines() if "←" in line)
    assert star.split()[:3] == ["3", "2.176", "1.674×"]
    assert "= 2.50 tokens" in out
    assert len(table_rows(out)) == 9


def test_plan_says_when_plain_decoding_wins(capsys):
    code, out, _ = run(capsys, "plan", "--alpha", "0.3", "--cost", "0.9", "--gamma-max", "4")
    assert code == 0
    star = next(line for line in out.splitlines() if "←" in line)
    assert star.split()[0] == "0" and "plain decoding" in star
    assert "continuous optimum: none" in out and "plain decoding is best" in out


def test_plan_with_a_flat_verify_cost(capsys):
    code, out, _ = run(capsys, "plan", "--alpha", "0.9", "--cost", "0.1", "--verify-cost", "1.5",
                       "--gamma-max", "6")
    assert code == 0
    rows = table_rows(out)
    assert rows[0][2] == "1.000×"
    assert rows[2][2] == f"{(1 + 0.9 + 0.81) / (0.2 + 1.5):.3f}×"
    assert "v(k) = 1.5 for k ≥ 2" in out


def write_calibration(tmp_path, alpha=0.7) -> str:
    ks = [1, 2, 4, 6, 8, 16]
    curve = np.interp(np.arange(1, 10), ks, [20.3, 37.1, 49.0, 73.8, 82.3, 126.0])
    m = CostModel(target_ms=list(curve), draft_ms=0.25 * 20.3, alpha=alpha)
    return str(m.save(tmp_path / "cal.json"))


def test_plan_from_a_calibration_file(capsys, tmp_path):
    path = write_calibration(tmp_path)
    code, out, _ = run(capsys, "plan", "--calibration", path)
    assert code == 0
    assert "α = 0.7   c = 0.25" in out and "measured" in out
    star = next(line for line in out.splitlines() if "←" in line)
    assert star.split()[0] == "0"  # the compute-bound curve: plain decoding
    # --alpha overrides the calibration's α; beyond K = 9 rows v is extrapolated.
    code, out, _ = run(capsys, "plan", "--calibration", path, "--alpha", "0.99", "--gamma-max", "12")
    star = next(line for line in out.splitlines() if "←" in line)
    assert code == 0 and int(star.split()[0]) > 0 and len(table_rows(out)) == 13
    assert "v(k) measured for k ≤ 9, continued linearly beyond" in out  # and not "measured" alone


def test_plan_reads_calibrate_json_output(capsys, tmp_path):
    data = json.loads(Path(write_calibration(tmp_path)).read_text())
    data["derived"] = {"cost": 0.25, "plan": []}
    f = tmp_path / "out.json"
    f.write_text(json.dumps(data))
    assert run(capsys, "plan", "--calibration", str(f))[0] == 0


def users_rows(out: str) -> dict[int, tuple[str, float]]:
    """K -> (γ per request, speed-up) from the --users table."""
    table = out.split("K concurrent requests", 1)[1].splitlines()
    return {int(p[0]): (p[1], float(p[-1].rstrip("×"))) for p in map(str.split, table)
            if p and p[0].isdigit()}


def test_plan_for_concurrent_users_falls_back_to_continuous_batching(capsys, tmp_path):
    """A memory-bound target (extra rows nearly free) and a draft whose pass
    grows with its batch: one request speculates; with many, a draft pass for
    all of them costs more than the tokens it buys, so γ = 0."""
    m = CostModel(target_ms=[100.0 + 2.0 * k for k in range(64)], draft_ms=20.0,
                  draft_batch_ms=[20.0 * b for b in range(1, 33)], alpha=0.9)
    path = str(m.save(tmp_path / "batch.json"))
    code, out, _ = run(capsys, "plan", "--calibration", path, "--users", "1,2,16", "--gamma-max", "8")
    rows = users_rows(out)
    assert code == 0 and sorted(rows) == [1, 2, 16]
    assert int(rows[1][0]) >= 3 and rows[1][1] > 1.5
    assert rows[16] == ("0", 1.0)
    assert int(rows[2][0]) <= int(rows[1][0])  # rows get dearer as the batch grows
    assert "--cost" not in out
    code, out, _ = run(capsys, "plan", "--calibration", path, "--users", "1", "--cost", "0.02")
    assert users_rows(out)[1] == rows[1] and "(--cost 0.02 is not used for K requests" in out
    # Without a calibration, or with one lacking the draft's batch curve, it says what is missing.
    code, _, err = run(capsys, "plan", "--alpha", "0.9", "--cost", "0.1", "--users", "2")
    assert code == 2 and "--users needs --calibration" in err
    flat = str(CostModel(target_ms=[10.0, 12.0], draft_ms=1.0, alpha=0.9).save(tmp_path / "flat.json"))
    code, _, err = run(capsys, "plan", "--calibration", flat, "--users", "2")
    assert code == 1 and "draft_batch_ms" in err and "--batch N > 1" in err


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--alpha", "0.8", "--cost", "0.1", "--users", "0"], "--users"),
    (["plan", "--alpha", "0.8", "--cost", "0.1", "--users", "2,x"], "--users"),
    (["plan", "--cost", "0.1"], "--alpha is required"),
    (["plan", "--alpha", "0.8"], "--cost is required"),
    (["plan", "--alpha", "1.5", "--cost", "0.1"], "--alpha"),
    (["plan", "--alpha", "x", "--cost", "0.1"], "--alpha"),
    (["plan", "--alpha", "0.8", "--cost", "-1"], "--cost"),
    (["plan", "--alpha", "0.8", "--cost", "0.1", "--verify-cost", "0"], "--verify-cost"),
    (["plan", "--alpha", "0.8", "--cost", "0.1", "--verify-cost", "1", "--calibration", "f"],
     "not allowed with"),
    (["plan", "--alpha", "0.8", "--cost", "0.1", "--gamma-max", "-2"], "--gamma-max"),
    ([], "choose a command"),
])
def test_plan_usage_errors_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_plan_calibration_without_alpha_needs_one(capsys, tmp_path):
    m = CostModel(target_ms=[10.0, 12.0], draft_ms=1.0)
    path = m.save(tmp_path / "noalpha.json")
    code, _, err = run(capsys, "plan", "--calibration", str(path))
    assert code == 2 and "does not contain it" in err
    assert run(capsys, "plan", "--calibration", str(path), "--alpha", "0.9")[0] == 0


def test_plan_runtime_errors_exit_1_with_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "--calibration", str(tmp_path / "missing.json"))
    assert code == 1 and "missing.json" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, _, err = run(capsys, "plan", "--calibration", str(bad))
    assert code == 1 and "bad.json" in err and len(err.strip().splitlines()) == 1


def test_a_ray_task_s_error_is_described_by_its_cause():
    """Ray's task errors start with a line naming only the task; the cause's
    first line says what went wrong."""
    from specdec_cpu.cli import _describe

    class TaskError(Exception):  # shaped as Ray's RayTaskError
        def __init__(self, cause: Exception) -> None:
            super().__init__("ray::HAProxyManager.ready() (pid=1)\n  File \"haproxy.py\"\nRuntimeError: ...")
            self.cause = cause

    cause = RuntimeError("HAProxy crashed during startup: cannot bind socket [0.0.0.0:8404]\nmore")
    assert _describe(TaskError(cause)) == ("ray::HAProxyManager.ready() (pid=1): RuntimeError: HAProxy crashed "
                                           "during startup: cannot bind socket [0.0.0.0:8404]")


def test_version_and_help(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and "specdec-cpu" in out
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and "--calibration" in out


def test_a_bad_settings_variable_stops_only_what_reads_it(capsys, monkeypatch, tmp_path):
    """A SPECDEC_* variable that does not parse: --help, other commands and
    the flag itself still work; a command left to read it exits 2 naming the
    variable and the flag, with no traceback (the CLI and from_flags alike)."""
    import argparse

    from specdec_cpu.settings import DecoderSettings, add_flags, from_flags

    missing = str(tmp_path / "none.gguf")
    monkeypatch.setenv("SPECDEC_N_CTX", "abc")
    monkeypatch.setenv("SPECDEC_NGRAM", "maybe")
    assert run(capsys, "plan", "--alpha", "0.8", "--cost", "0.1")[0] == 0
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0 and "SPECDEC_N_CTX" in out
    code, _, err = run(capsys, "generate", "--target", missing, "hi")
    assert code == 2 and "Traceback" not in err
    assert "environment variable SPECDEC_N_CTX must be an integer, got 'abc'" in err and "--ctx" in err
    assert "SPECDEC_NGRAM must be true or false" in err  # every bad variable at once
    code, _, err = run(capsys, "generate", "--ctx", "128", "--target", missing, "hi")
    assert code == 2 and "SPECDEC_NGRAM must be true or false, got 'maybe'" in err and "--ngram" in err
    assert "SPECDEC_N_CTX" not in err
    code, _, err = run(capsys, "generate", "--ctx", "128", "--no-ngram", "--target", missing, "hi")
    assert code == 1 and "none.gguf" in err and "SPECDEC_" not in err  # past the settings: the missing model
    parser = argparse.ArgumentParser()
    add_flags(parser, DecoderSettings)
    with pytest.raises(ValueError, match="SPECDEC_N_CTX must be an integer"):
        from_flags(parser.parse_args(["--ngram"]), DecoderSettings)
    assert from_flags(parser.parse_args(["--ngram", "--ctx", "64"]), DecoderSettings).n_ctx == 64


def test_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional 'plot' extra (matplotlib)")
    png = tmp_path / "plan.png"
    code, out, err = run(capsys, "plan", "--alpha", "0.8", "--cost", "0.1", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in out


def test_plot_without_matplotlib_is_one_clear_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    code, _, err = run(capsys, "plan", "--alpha", "0.8", "--cost", "0.1", "--plot", str(tmp_path / "p.png"))
    assert code == 1 and "matplotlib" in err and len(err.strip().splitlines()) == 1


def test_emit_falls_back_to_ascii():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    emit("γ* = 6 at 2.47× ← best", stream)
    stream.flush()
    assert raw.getvalue().decode("ascii").strip() == "gamma* = 6 at 2.47x <- best"


# ------------------------------------------------------------------ calibrate (fake decoder)

class _SleepLM:
    """Just enough of a CausalLM for timing: eval sleeps a little per row."""

    def __init__(self, ms_per_row: float) -> None:
        self.ms, self.tokens = ms_per_row, []
        self.n_vocab, self.n_ctx = 500, 512

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, tokens, n_logits=1):
        time.sleep(self.ms * len(tokens) / 1000.0)
        self.tokens.extend(tokens)
        return np.zeros((n_logits, self.n_vocab), np.float32)

    def truncate(self, n):
        del self.tokens[n:]


@pytest.fixture
def fake_decoder_module(monkeypatch, tmp_path):
    """Stands in for specdec_cpu.decoding.single (llama.cpp and the extension are not needed)."""
    loaded = {}

    class SpeculativeDecoder:
        @classmethod
        def from_gguf(cls, target, draft=None, *, settings, **_):
            n_threads, n_ctx, draft_vocab = settings.n_threads, settings.n_ctx, settings.draft_vocab
            dec = cls()
            dec.target, dec.draft = _SleepLM(2.0), _SleepLM(0.5)
            dec.target_path, dec.draft_path, dec.n_threads = str(target), str(draft), n_threads or 2
            loaded.update(target=target, draft=draft, n_threads=n_threads, n_ctx=n_ctx, draft_vocab=draft_vocab)
            return dec

        def generate(self, prompt, *, max_tokens, params, gamma=None):
            loaded.setdefault("params", params)
            return SimpleNamespace(stats=SimpleNamespace(mean_alpha=0.9, alpha_rows=8))

    module = types.ModuleType("specdec_cpu.decoding.single")
    module.SpeculativeDecoder = SpeculativeDecoder
    monkeypatch.setitem(sys.modules, "specdec_cpu.decoding.single", module)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDEC_CALIBRATION_DIR", raising=False)
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a header, no model
    return loaded


def test_calibrate_prints_costs_alpha_and_plan(capsys, tmp_path, fake_decoder_module):
    t, d = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
    code, out, err = run(capsys, "calibrate", "--target", t, "--draft", d, "--gamma-max", "3",
                         "--threads", "2", "--temperature", "0.5", "--top-k", "20", "--n-tokens", "8")
    assert code == 0, err
    assert fake_decoder_module["n_threads"] == 2 and fake_decoder_module["draft_vocab"] is None
    assert fake_decoder_module["params"].temperature == 0.5 and fake_decoder_module["params"].top_k == 20
    assert "draft cost c = T_draft(1) / T_target(1)" in out
    assert "verify cost v(k)" in out and "acceptance α = 0.900" in out
    assert "cache:" in out and str(tmp_path / "cache") in out and "from the cache" not in out
    assert "draft pass time by batch size b" in out  # --batch 8 by default: both curves
    assert len(table_rows(out)) == 4 and "←" in out
    # --json: machine-readable, and usable as `plan --calibration`.
    code, out, err = run(capsys, "calibrate", "--target", t, "--draft", d, "--gamma-max", "3",
                         "--temperature", "0.5", "--top-k", "20", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["alpha"] == pytest.approx(0.9) and data["derived"]["from_cache"] == "all"
    assert len(data["target_ms"]) == 64 and len(data["draft_batch_ms"]) == 8  # a batch's curves
    assert data["draft_batch_ms"][7] > 4 * data["draft_batch_ms"][0]  # the fake draft costs per row
    assert data["derived"]["verify_cost"][0] == 1.0 and "gamma_star" in data["derived"]
    f = tmp_path / "cal.json"
    f.write_text(out)
    assert run(capsys, "plan", "--calibration", str(f))[0] == 0
    # A stored calibration is said to be one; other sampling settings measure α again.
    code, out, _ = run(capsys, "calibrate", "--target", t, "--draft", d, "--gamma-max", "3", "--threads", "2",
                       "--temperature", "0.5", "--top-k", "20")
    assert "read from the cache, nothing measured now (--recalibrate measures again)" in out
    code, out, _ = run(capsys, "calibrate", "--target", t, "--draft", d, "--gamma-max", "3", "--threads", "2")
    assert "timings read from the cache, α measured now" in out
    code, out, _ = run(capsys, "calibrate", "--target", t, "--draft", d, "--gamma-max", "3", "--threads", "2",
                       "--recalibrate")
    assert "from the cache" not in out
    # The draft cut to part of its vocabulary (generate's --draft-vocab) is calibrated as asked.
    code, out, err = run(capsys, "calibrate", "--target", t, "--draft", d, "--draft-vocab", "98304", "--json")
    assert code == 0, err
    assert fake_decoder_module["draft_vocab"] == 98304


def test_calibrate_errors(capsys, tmp_path, fake_decoder_module):
    t, d = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
    code, _, err = run(capsys, "calibrate", "--target", str(tmp_path / "nope.gguf"), "--draft", d)
    assert code == 1 and "nope.gguf" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "calibrate", "--target", t, "--draft", d, "--top-p", "0")
    assert code == 2 and "--top-p" in err
    code, _, err = run(capsys, "calibrate", "--target", t)
    assert code == 2 and "--draft" in err


def test_output_to_a_closed_pipe_ends_quietly() -> None:
    """`specdec-cpu plan ... | head -1`: the reader gone is no error."""
    import subprocess

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "specdec_cpu.cli", "plan", "--alpha", "0.8", "--cost", "0.1"],
                              stdout=write, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == b""

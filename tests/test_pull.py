"""`specdec-cpu pull` without the network: huggingface_hub is replaced by a
fake module (or made unimportable), the downloads land in a fake hub cache."""

from __future__ import annotations

import sys
import types

import pytest
from model_stores import add_hub_file, isolated_stores

from specdec_cpu import discovery
from specdec_cpu.cli import main
from specdec_cpu.discovery.pull import choose_file, parse_spec
from specdec_cpu.errors import PullError


@pytest.fixture
def stores(monkeypatch, tmp_path):
    return isolated_stores(monkeypatch, tmp_path)


def fake_hub(monkeypatch, *, files=(), list_error=None, download_error=None, cache=None, gguf=None):
    """Install a fake ``huggingface_hub``; returns the list of files it was asked for."""
    asked = []
    hub = types.ModuleType("huggingface_hub")

    def list_repo_files(repo_id, **_):
        if list_error is not None:
            raise list_error
        return list(files)

    def hf_hub_download(repo_id, filename, **_):
        asked.append(filename)
        if download_error is not None:
            raise download_error
        return str(add_hub_file(cache, repo_id, filename, gguf))

    hub.list_repo_files, hub.hf_hub_download = list_repo_files, hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    return asked


def error_named(name: str, base=Exception) -> Exception:
    """An exception of a class called ``name``, as huggingface_hub raises them."""
    return type(name, (base,), {})(f"{name} raised")


def test_without_the_package_the_message_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    code = main(["pull", "org/Repo-GGUF"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "the 'hub' extra" in err and "pip install 'specdec-cpu[hub]'" in err


@pytest.mark.parametrize("exc, message", [
    (error_named("OfflineModeIsEnabled", ConnectionError), "offline (HF_HUB_OFFLINE is set"),
    (error_named("ConnectionError", OSError), "cannot reach the Hugging Face hub for org/Repo-GGUF"),
    (error_named("RepositoryNotFoundError"), "org/Repo-GGUF: no such repository on the Hugging Face hub"),
])
def test_network_and_repository_errors_are_one_line(monkeypatch, capsys, stores, exc, message):
    fake_hub(monkeypatch, list_error=exc)
    code = main(["pull", "org/Repo-GGUF"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and message in err, err


def test_offline_download_of_a_named_file(monkeypatch, capsys, stores):
    # As in huggingface_hub, the offline error is a kind of EntryNotFoundError: it must not read "no file".
    entry_not_found = type("EntryNotFoundError", (Exception,), {})
    asked = fake_hub(monkeypatch, list_error=AssertionError("no listing for a named file"),
                     download_error=error_named("LocalEntryNotFoundError", entry_not_found))
    code = main(["pull", "org/Repo-GGUF:m-q4_k_m.gguf"])
    err = capsys.readouterr().err
    assert code == 1 and asked == ["m-q4_k_m.gguf"]
    assert "cannot download org/Repo-GGUF:m-q4_k_m.gguf: offline" in err and err.count("\n") == 1


def test_repo_alone_takes_q4_k_m_and_lands_where_discovery_looks(monkeypatch, capsys, stores, tiny_target):
    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "m-F16-00001-of-00002.gguf",
             "m-F16-00002-of-00002.gguf"]
    asked = fake_hub(monkeypatch, files=files, cache=stores["HF_HUB_CACHE"], gguf=tiny_target)
    code = main(["pull", "https://huggingface.co/org/Repo-GGUF"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert asked == ["m-Q4_K_M.gguf"] and "org/Repo-GGUF: downloading m-Q4_K_M.gguf" in err
    assert "use it as: specdec-cpu chat --target org/Repo-GGUF:m-Q4_K_M.gguf" in out
    path = discovery.resolve_model("org/Repo-GGUF:m-Q4_K_M.gguf")
    assert path.read_bytes() == open(tiny_target, "rb").read()
    # A tag picks a file, a split file comes with all its parts.
    code = main(["pull", "org/Repo-GGUF:F16"])
    assert code == 0 and asked[1:] == ["m-F16-00001-of-00002.gguf", "m-F16-00002-of-00002.gguf"]
    capsys.readouterr()
    # A later part named: all parts come, and the name printed is the one discovery lists (the first part's).
    code = main(["pull", "org/Repo-GGUF:m-F16-00002-of-00002.gguf"])
    out = capsys.readouterr().out
    assert code == 0 and "--target org/Repo-GGUF:m-F16-00001-of-00002.gguf" in out
    assert discovery.resolve_model("org/Repo-GGUF:m-F16-00001-of-00002.gguf")


def test_choosing_a_file():
    files = ["a-Q8_0.gguf", "a-Q6_K.gguf", "x/mmproj.gguf", "a-IQ2_M.gguf"]
    assert choose_file("o/r", files, None) == "a-Q6_K.gguf"  # Q6_K before Q8_0 in PREFERRED
    assert choose_file("o/r", ["only.gguf", "README.md"], None) == "only.gguf"
    with pytest.raises(PullError, match=r"o/r has 2 GGUF files; choose one with `specdec-cpu pull o/r:FILE`, "
                                        r"FILE one of: a-IQ2_M.gguf, b-IQ3_M.gguf"):
        choose_file("o/r", ["a-IQ2_M.gguf", "b-IQ3_M.gguf"], None)
    # Two files of the preferred tag: asked which, not a larger file of the next tag instead.
    split_q4 = ["Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M.gguf",
                "m-Q8_0.gguf"]
    with pytest.raises(PullError, match=r"o/r has 2 Q4_K_M GGUF files; choose one .*FILE one of: "
                                        r"Q4_K_M/m-Q4_K_M-00001-of-00002.gguf, m-Q4_K_M.gguf"):
        choose_file("o/r", split_q4, None)
    with pytest.raises(PullError, match="has no GGUF file 'Q5_K_M'"):
        choose_file("o/r", files, "Q5_K_M")
    with pytest.raises(PullError, match="has no GGUF files"):
        choose_file("o/r", ["README.md"], None)
    assert parse_spec("hf.co/o/r:f.gguf") == ("o/r", "f.gguf")
    with pytest.raises(PullError, match="expected a Hugging Face repository as ORG/REPO"):
        parse_spec("just-a-name")

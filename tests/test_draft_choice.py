"""The draft picked among the models on disk: the same vocabulary (by the
rule the loader applies), smaller than the target, the cheapest first; and
the vocabulary fingerprints that rule is checked on."""

from __future__ import annotations

import pytest
from model_stores import add_file, add_ollama_model, isolated_stores

from specdec_cpu import discovery
from specdec_cpu.discovery.fingerprint import make_print, mismatch
from specdec_cpu.discovery.units import format_bytes, format_params


@pytest.fixture
def stores(monkeypatch, tmp_path):
    return isolated_stores(monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def extra_models(tmp_path_factory):
    """Models beside conftest's: a still smaller draft (n_embd 32), a larger
    model of the target's vocabulary, and a target padded to 512 ids."""
    from tiny_gguf import write_tiny_model

    d = tmp_path_factory.mktemp("draft_choice")
    return {
        "smallest": str(write_tiny_model(d / "smallest.gguf", n_vocab=384, seed=0, n_layer=1, n_embd=32, n_head=2)),
        "larger": str(write_tiny_model(d / "larger.gguf", n_vocab=384, seed=0, n_layer=3)),
        "padded_target": str(write_tiny_model(d / "padded_target.gguf", n_vocab=512, seed=0, n_layer=2)),
    }


def choose(target, model_dirs=()):
    return discovery.choose_draft(target, discovery.discover(model_dirs))


def test_picks_the_smallest_compatible_draft(stores, tiny_target, tiny_small_draft, extra_models):
    root = stores["OLLAMA_MODELS"]
    target = add_ollama_model(root, "tiny:2l", tiny_target)
    add_ollama_model(root, "tiny:1l", tiny_small_draft)
    smallest = add_ollama_model(root, "tiny:1l-narrow", extra_models["smallest"])
    add_ollama_model(root, "tiny:3l", extra_models["larger"])  # same vocabulary, more parameters
    choice = choose(target)
    assert choice.entry is not None and choice.entry.path == smallest
    n_small = discovery.describe(smallest).meta.n_params
    n_target = discovery.describe(target).meta.n_params
    assert choice.line == (f"draft: tiny:1l-narrow (same vocabulary, {format_params(n_small)} vs "
                           f"{format_params(n_target)} parameters; smallest of 2 candidates)")
    assert format_params(n_target) == "131K"


def test_an_incompatible_vocabulary_is_never_chosen(stores, tiny_target, tiny_mismatched_draft, tiny_spm):
    root = stores["OLLAMA_MODELS"]
    target = add_ollama_model(root, "tiny:2l", tiny_target)
    add_ollama_model(root, "changed:1l", tiny_mismatched_draft)  # two token texts differ
    add_ollama_model(root, "spm:1l", tiny_spm)                   # another vocabulary type
    choice = choose(target)
    assert choice.entry is None
    assert choice.line == "draft: none (none of the 2 smaller models found shares the target's vocabulary)"


def test_nothing_larger_and_not_the_target_itself(stores, tmp_path, tiny_target, extra_models):
    root = stores["OLLAMA_MODELS"]
    target = add_ollama_model(root, "tiny:2l", tiny_target)
    add_ollama_model(root, "tiny:latest", tiny_target)  # the same blob under a second name
    add_file(tmp_path / "models", "copy.gguf", tiny_target)  # an identical copy: not smaller
    add_ollama_model(root, "tiny:3l", extra_models["larger"])
    choice = choose(target, [tmp_path / "models"])
    assert choice.entry is None and choice.line == "draft: none (no smaller model found on this machine)"


def test_a_vocabulary_only_file_is_no_draft(stores, tmp_path, tiny_target, tiny_small_draft):
    """llama.cpp's models/ggml-vocab-*.gguf hold a model's metadata and no tensor."""
    import gguf

    folder = tmp_path / "models"
    target = add_file(folder, "target.gguf", tiny_target)
    reader = gguf.GGUFReader(tiny_target)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(folder / "llama.cpp" / "models" / "ggml-vocab-tiny.gguf"), arch)
    (folder / "llama.cpp" / "models").mkdir(parents=True)
    for name, f in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            kind = f.types[0]
            sub = {"sub_type": f.types[-1]} if kind == gguf.GGUFValueType.ARRAY else {}
            writer.add_key_value(name, f.contents(), kind, **sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert discovery.describe(folder / "llama.cpp/models/ggml-vocab-tiny.gguf").meta.n_params is None
    assert choose(target, [folder]).entry is None
    small = add_file(folder, "small.gguf", tiny_small_draft)
    assert str(choose(target, [folder]).entry.path) == str(small)


def test_parameters_rank_before_bytes(stores, tmp_path, tiny_target, extra_models):
    """A model with fewer bytes but more parameters is no draft; a lower-bit copy
    of the target's own weights (as many parameters, fewer bytes) is one."""
    from specdec_cpu.engine import quantize

    folder = tmp_path / "models"
    target = add_file(folder, "target-f32.gguf", tiny_target)
    larger_q8 = quantize(extra_models["larger"], folder / "larger-q8_0.gguf", "Q8_0")
    larger, t = discovery.describe(larger_q8), discovery.describe(target)
    assert larger.size < t.size and larger.meta.n_params > t.meta.n_params
    assert choose(target, [folder]).entry is None
    same_q8 = quantize(tiny_target, folder / "target-q8_0.gguf", "Q8_0")
    choice = choose(target, [folder])
    assert str(choice.entry.path) == str(same_q8)
    assert choice.line.startswith("draft: target-q8_0.gguf (same vocabulary and parameters, Q8_0 ")
    assert choice.line.endswith(f" vs F32 {format_bytes(t.size)})")


def test_a_padded_vocabulary_matches(stores, tmp_path, tiny_small_draft, extra_models):
    """A draft with fewer trailing ids than the target (384 vs 512) shares its vocabulary."""
    target = add_file(tmp_path / "models", "padded-target.gguf", extra_models["padded_target"])
    draft = add_file(tmp_path / "models", "draft-384.gguf", tiny_small_draft)
    choice = choose(target, [tmp_path / "models"])
    assert choice.entry is not None and choice.entry.path == draft
    t, d = discovery.vocabulary(target), discovery.vocabulary(draft)
    assert (t.n_vocab, d.n_vocab) == (512, 384) and t.digest != d.digest
    assert mismatch(t, d) is None and mismatch(d, t) is None


def test_fingerprint_rule(stores, tiny_target, tiny_mismatched_draft, tiny_spm, tiny_padded_draft):
    from tiny_gguf import mismatched_ids

    target = discovery.vocabulary(tiny_target)
    assert mismatch(target, discovery.vocabulary(tiny_padded_draft)) is None
    first = min(mismatched_ids(384))
    assert mismatch(target, discovery.vocabulary(tiny_mismatched_draft)) == f"token texts differ (first at id {first})"
    assert mismatch(target, discovery.vocabulary(tiny_spm)) == "vocabulary types differ (bpe vs spm)"
    texts = [b"a", b"b", b"c"]
    base = make_print("bpe", 0, 1, texts)
    assert mismatch(base, make_print("bpe", 0, 2, texts)) == "EOS ids differ (1 vs 2)"
    assert mismatch(base, make_print("bpe", None, 1, texts)) == "BOS ids differ (0 vs None)"
    assert mismatch(base, make_print("bpe", 0, 1, texts + [b"pad"])) is None


@pytest.mark.parametrize("draft_fixture", ["tiny_draft", "tiny_padded_draft", "tiny_mismatched_draft",
                                           "tiny_spm", "tiny_no_template"])
def test_fingerprints_agree_with_the_loader(stores, request, tiny_target, draft_fixture):
    """The rule on metadata gives the answer engine.check_vocab_compatible gives on the loaded models."""
    from specdec_cpu.engine import LlamaWeights, check_vocab_compatible
    from specdec_cpu.errors import VocabMismatchError

    draft = request.getfixturevalue(draft_fixture)
    with LlamaWeights(tiny_target) as t, LlamaWeights(draft) as d:
        try:
            check_vocab_compatible(t, d)
            loader_ok = True
        except VocabMismatchError:
            loader_ok = False
    assert (mismatch(discovery.vocabulary(tiny_target), discovery.vocabulary(draft)) is None) == loader_ok

"""Shared fixtures: the kernel ISA, and tiny GGUF models written once per
test session.

Every model fixture yields the path (a str) of a file under a session temp
directory.  Models with the same ``seed`` share the tensors they have in
common (see tiny_gguf), so the draft fixtures are correlated with the target.
"""

from __future__ import annotations

import pytest

from specdec_cpu import sampling

TARGET_VOCAB = 384
LARGE_VOCAB = 50_000
PADDED_VOCAB = TARGET_VOCAB + 128


@pytest.fixture(params=sampling.supported_isas())
def isa(request):
    """Runs a test once per kernel ISA this CPU supports (scalar first)."""
    before = sampling.active_isa()
    sampling.set_isa(request.param)
    yield request.param
    sampling.set_isa(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_gguf")


@pytest.fixture(scope="session", autouse=True)
def calibration_dir(tmp_path_factory):
    """Decoders store their first-use timings here, not in the user's cache
    (the models' temporary paths would only leave stale entries behind)."""
    import os

    path = tmp_path_factory.mktemp("calibration")
    before = os.environ.get("SPECDEC_CALIBRATION_DIR")
    os.environ["SPECDEC_CALIBRATION_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("SPECDEC_CALIBRATION_DIR", None)
    else:
        os.environ["SPECDEC_CALIBRATION_DIR"] = before


def _write(tiny_dir, name, **kwargs):
    pytest.importorskip("gguf")
    from tiny_gguf import write_tiny_model

    path = tiny_dir / name
    if not path.exists():
        write_tiny_model(path, **kwargs)
    return str(path)


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    """2 layers, n_embd 64, byte-level BPE vocabulary of 384 ids, ChatML template."""
    return _write(tiny_dir, "target.gguf", n_vocab=TARGET_VOCAB, seed=0, n_layer=2)


@pytest.fixture(scope="session")
def tools_target(tiny_dir):
    """The tiny target with a chat template that renders tools as Qwen2.5's (server_thread.TOOLS_TEMPLATE)."""
    pytest.importorskip("gguf")
    from server_thread import write_tools_model

    return write_tools_model(tiny_dir / "tools_target.gguf")


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir):
    """The target's shape and vocabulary, weights = target's + 4% noise: a
    high-acceptance draft (alpha ~0.85 at T=1, greedy agreement ~75%)."""
    return _write(tiny_dir, "draft.gguf", n_vocab=TARGET_VOCAB, seed=0, n_layer=2,
                  noise=0.04, noise_seed=7)


@pytest.fixture(scope="session")
def tiny_small_draft(tiny_dir):
    """A smaller (1-layer) draft sharing the target's first layer: alpha ~0.3."""
    return _write(tiny_dir, "small_draft.gguf", n_vocab=TARGET_VOCAB, seed=0, n_layer=1)


@pytest.fixture(scope="session")
def tiny_large_vocab(tiny_dir):
    """50,000-id vocabulary (vocabulary-scale rows), n_embd 32, tied embeddings."""
    return _write(tiny_dir, "large_vocab.gguf", n_vocab=LARGE_VOCAB, seed=3, n_layer=2,
                  n_embd=32, n_head=2, tie_embeddings=True)


@pytest.fixture(scope="session")
def tiny_large_vocab_draft(tiny_dir):
    """A high-acceptance draft for tiny_large_vocab (its weights + 4% noise)."""
    return _write(tiny_dir, "large_vocab_draft.gguf", n_vocab=LARGE_VOCAB, seed=3, n_layer=2,
                  n_embd=32, n_head=2, tie_embeddings=True, noise=0.04, noise_seed=9)


@pytest.fixture(scope="session")
def tiny_mismatched_draft(tiny_dir):
    """Same size as the target but some token texts differ (see tiny_gguf.mismatched_ids)."""
    return _write(tiny_dir, "mismatched.gguf", n_vocab=TARGET_VOCAB, seed=1, n_layer=1,
                  vocab_variant="mismatch")


@pytest.fixture(scope="session")
def tiny_padded_draft(tiny_dir):
    """Same texts as the target plus 128 extra ids at the end (vocab 512)."""
    return _write(tiny_dir, "padded.gguf", n_vocab=PADDED_VOCAB, seed=0, n_layer=1)


@pytest.fixture(scope="session")
def tiny_spm(tiny_dir):
    """A SentencePiece-vocabulary model (another vocabulary type), no chat template."""
    return _write(tiny_dir, "spm.gguf", n_vocab=300, seed=4, n_layer=1, tokenizer="spm",
                  chat_template=None)


@pytest.fixture(scope="session")
def tiny_no_template(tiny_dir):
    """The target's vocabulary without a chat template."""
    return _write(tiny_dir, "no_template.gguf", n_vocab=TARGET_VOCAB, seed=5, n_layer=1,
                  chat_template=None)


@pytest.fixture(scope="session")
def tiny_nan_target(tiny_dir):
    """The target's weights, but token 300 has a NaN embedding: every position
    after it gets NaN logits."""
    return _write(tiny_dir, "nan_target.gguf", n_vocab=TARGET_VOCAB, seed=0, n_layer=2, nan_token=300)


# -- a vocabulary large enough for the kernels' support-list paths ------------

WIDE_VOCAB = 4096


@pytest.fixture(scope="session")
def tiny_wide_target(tiny_dir):
    """4,096 ids: a truncated support (top-k / top-p) of up to V/8 = 512 ids
    takes the kernels' sorted-support path, an untruncated row the full one."""
    return _write(tiny_dir, "wide_target.gguf", n_vocab=WIDE_VOCAB, seed=21, n_layer=2)


@pytest.fixture(scope="session")
def tiny_wide_draft(tiny_dir):
    """tiny_wide_target's weights + 10% noise: α between ~0.4 and ~0.95."""
    return _write(tiny_dir, "wide_draft.gguf", n_vocab=WIDE_VOCAB, seed=21, n_layer=2,
                  noise=0.1, noise_seed=5)


# -- files that must fail to load -------------------------------------------


@pytest.fixture(scope="session")
def empty_gguf(tiny_dir):
    path = tiny_dir / "empty.gguf"
    path.write_bytes(b"")
    return str(path)


@pytest.fixture(scope="session")
def non_gguf(tiny_dir):
    from tiny_gguf import write_garbage

    return str(write_garbage(tiny_dir / "not_a_model.gguf"))


@pytest.fixture(scope="session")
def truncated_gguf(tiny_dir, tiny_target):
    """The target with its tensor data cut (header and metadata intact)."""
    from tiny_gguf import write_truncated_copy

    return str(write_truncated_copy(tiny_target, tiny_dir / "truncated.gguf", keep_fraction=0.6))


@pytest.fixture(scope="session")
def unknown_arch_gguf(tiny_dir):
    """A well-formed GGUF whose architecture llama.cpp does not know."""
    return _write(tiny_dir, "unknown_arch.gguf", n_vocab=TARGET_VOCAB, seed=0, n_layer=1,
                  architecture="nosucharch")


# -- the soak test's size ----------------------------------------------------


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", default=False,
                     help="run the soak test at full size (500 generations) instead of a short run")
    parser.addoption("--soak-generations", type=int, default=None, metavar="N",
                     help="number of generations of the soak test (overrides --soak)")


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: long-run resource test (short unless --soak)")


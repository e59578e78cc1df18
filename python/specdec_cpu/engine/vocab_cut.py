"""A draft model cut to the common part of its vocabulary (docs/math.md §10).

A small draft spends much of its pass on its output layer: for Qwen2.5-0.5B
the output rows (tied to the token embeddings, Q8_0) are a third of the Q4_0
draft's bytes.  Byte-pair ids come roughly in merge order, so most text is
made of the first ids; the rest (for Qwen2.5, ids above ~96k: mostly CJK and
other scripts) are rarely drafted at all.  A cut draft keeps the output and
embedding rows of ids ``[0, n_keep)`` and of every control token, so its
passes are cheaper, and the decoding stays exact: a draft token is sampled
from the cut model's q over the ids it has, and q = 0 on the rest is simply
what the verifier sees (a target token the cut lacks comes from the
residual).

The cut is a GGUF file of its own, written with ``gguf`` and self-describing:
``specdec.source_token_ids`` lists, as runs ``start+length,...``, the source
id of each of its ids in order, ``specdec.source_n_vocab`` the source's size
and ``specdec.stand_in`` the source id it reads in place of an id it lacks
(a space, where the vocabulary has one).  :class:`~.weights.LlamaWeights`
reads them back as :attr:`source_ids` and :attr:`input_map`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from ..errors import ModelLoadError
from ..paths import atomic_path, cache_dir
from .gguf_meta import SOURCE_IDS_KEY, SOURCE_N_VOCAB_KEY, STAND_IN_KEY, check_gguf_file, format_runs

__all__ = ["cut_draft", "cut_vocab", "cached_cut"]

_NORMAL = 1  # gguf's TokenType.NORMAL: every other type (control, user-defined, unused) is kept
_ROW_TENSORS = ("token_embd.weight", "output.weight")  # one row per token id
_SPACES = ("Ġ", "▁", " ")  # a space in byte-level BPE, SentencePiece and plain vocabularies


def cut_vocab(src: Union[str, "os.PathLike[str]"], dst: Union[str, "os.PathLike[str]"], n_keep: int) -> str:
    """Write ``src`` with its vocabulary cut to ids ``[0, n_keep)`` plus every
    non-normal (control) token to ``dst`` (atomically); returns ``dst``.

    Raises ValueError when ``n_keep`` is not an int in [1, the vocabulary's
    size) or keeps none of a BPE tokenizer's merges, ModelLoadError when ``src`` is no GGUF model with a vocabulary,
    or already a cut.
    """
    import gguf  # only needed here: the package's other parts read GGUF through llama.cpp

    if isinstance(n_keep, bool) or not isinstance(n_keep, int):
        raise ValueError(f"n_keep must be an int, got {n_keep!r}")
    src_s, dst_s = check_gguf_file(src), os.fspath(dst)
    reader = gguf.GGUFReader(src_s)
    fields = reader.fields
    if SOURCE_IDS_KEY in fields:
        raise ModelLoadError(f"{src_s} is already a cut vocabulary; cut its source instead")
    if "tokenizer.ggml.tokens" not in fields or "tokenizer.ggml.token_type" not in fields:
        raise ModelLoadError(f"{src_s} has no tokenizer.ggml.tokens/token_type to cut")
    texts = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    if not 1 <= n_keep < len(texts):
        raise ValueError(f"a cut keeps between 1 and {len(texts) - 1} of the {len(texts)} ids of {src_s}, "
                         f"got {n_keep}")
    keep = np.concatenate([np.arange(n_keep), n_keep + np.flatnonzero(np.asarray(types[n_keep:]) != _NORMAL)])
    kept_texts = {texts[i] for i in keep}
    merges = fields["tokenizer.ggml.merges"].contents() if "tokenizer.ggml.merges" in fields else []
    if merges and not any(m.replace(" ", "") in kept_texts for m in merges):  # llama.cpp loads no BPE without
        raise ValueError(f"a cut to {n_keep} ids keeps none of the tokenizer merges of {src_s}; keep more ids")
    stand_in = next((i for i in range(n_keep) if texts[i] in _SPACES), 0)

    arch = fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(None, arch)
    for name, field in fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in keep]
        elif name == "tokenizer.ggml.merges":  # a merge must make a token the cut has
            value = [m for m in value if m.replace(" ", "") in kept_texts]
        elif name.startswith("tokenizer.ggml.") and name.endswith("_token_id"):
            at = int(np.searchsorted(keep, int(value)))  # its new id, or the stand-in's if the cut lacks it
            value = at if at < len(keep) and keep[at] == int(value) else stand_in
        elif name == f"{arch}.vocab_size":
            value = len(keep)
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    writer.add_string(SOURCE_IDS_KEY, format_runs(keep))
    writer.add_uint32(SOURCE_N_VOCAB_KEY, len(texts))
    writer.add_uint32(STAND_IN_KEY, stand_in)
    for t in reader.tensors:
        data = t.data
        if t.name in _ROW_TENSORS:
            data = np.ascontiguousarray(data[keep])
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    with atomic_path(dst_s, suffix=".gguf.tmp") as tmp:
        writer.write_header_to_file(path=Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return dst_s


def cached_cut(src: Union[str, "os.PathLike[str]"], n_keep: int, directory: Optional[Path] = None,
               progress: Optional[Callable[[str], None]] = None) -> str:
    """The cut of ``src`` to ``n_keep`` ids in the cache (``drafts/``), written
    on first use (seconds for a 0.5B draft; ``progress`` gets a line before)
    and reused while ``src`` is unchanged (same path, size and modification
    time).  Errors as :func:`cut_vocab`'s."""
    src_s = check_gguf_file(src)
    st = os.stat(src_s)
    key = hashlib.sha256(f"{os.path.abspath(src_s)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = (directory or cache_dir() / "drafts")
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"{Path(src_s).stem}-vocab{n_keep}-{key}.gguf"
    if not dst.is_file():
        if progress is not None:
            progress(f"cutting {Path(src_s).name}'s vocabulary to its first {n_keep} ids "
                     "(once; the cut is cached) ...")
        cut_vocab(src_s, dst, n_keep)
    return str(dst)


def cut_draft(draft: Optional[Union[str, "os.PathLike[str]"]], draft_vocab: Optional[int],
              progress: Optional[Callable[[str], None]] = None) -> Optional[str]:
    """The draft a decoder loads for its ``draft_vocab`` argument: ``draft``
    itself for None, else its cached cut (ValueError names the argument)."""
    if draft_vocab is None:
        return None if draft is None else os.fspath(draft)
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or draft_vocab < 1:
        raise ValueError(f"draft_vocab must be an int >= 1 (ids the draft keeps), got {draft_vocab!r}")
    if draft is None:
        raise ValueError("draft_vocab needs a draft model to cut")
    try:
        return cached_cut(draft, draft_vocab, progress=progress)
    except ValueError as exc:
        raise ValueError(f"draft_vocab={draft_vocab}: {exc}") from None

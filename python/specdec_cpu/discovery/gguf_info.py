"""What a GGUF file says about itself, read with the ``gguf`` package.

The file is memory-mapped and only its header is parsed (metadata and tensor
descriptions): no weights are read, and llama.cpp is not involved.  This is
the only module of :mod:`specdec_cpu.discovery` that opens GGUF files.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from ..errors import ModelLoadError

__all__ = ["GGUFInfo", "GGUFContents", "read_error", "read_gguf", "file_type_name", "VOCAB_TYPES"]

PathLike = Union[str, "os.PathLike[str]"]

#: ``tokenizer.ggml.model`` -> llama.cpp's vocabulary type (engine.vocab.VOCAB_TYPE_NAMES).
VOCAB_TYPES = {"gpt2": "bpe", "llama": "spm", "bert": "wpm", "t5": "ugm", "rwkv": "rwkv",
               "plamo2": "plamo2", "none": "none", "no_vocab": "none"}

# The BOS/EOS ids llama.cpp assumes when a file names none (llama-vocab.cpp).
_DEFAULT_SPECIAL = {"spm": (1, 2), "bpe": (11, 11), "wpm": (101, None), "ugm": (None, 1),
                    "plamo2": (1, 2)}

_CUT_KEY = "specdec.source_token_ids"  # engine.vocab_cut.SOURCE_IDS_KEY, without importing engine
_KV_BYTES = 2  # llama.cpp's default KV cache type is F16


@dataclass(frozen=True)
class GGUFInfo:
    """Metadata of one GGUF model (of all its parts, for a split file)."""

    architecture: Optional[str]
    model_name: Optional[str]        # general.name
    file_type: Optional[str]         # quantisation, e.g. "Q4_K_M", "F16"
    n_params: Optional[int]          # from the tensor shapes
    n_vocab: Optional[int]
    vocab_type: Optional[str]        # "bpe", "spm", ... (llama.cpp's names)
    tokenizer_model: Optional[str]   # tokenizer.ggml.model
    bos: Optional[int]
    eos: Optional[int]
    chat_template: bool
    context_length: Optional[int]    # trained context
    kv_bytes_per_token: Optional[int]  # F16 K and V over all layers, None without attention metadata
    cut: bool                        # a vocabulary cut written by specdec-cpu (engine/vocab_cut.py)


@dataclass(frozen=True)
class GGUFContents:
    """:class:`GGUFInfo` and the vocabulary's token texts (raw bytes, by id)."""

    info: GGUFInfo
    token_texts: List[bytes]


def file_type_name(value: Optional[int]) -> Optional[str]:
    """``general.file_type`` as llama.cpp names it (``15`` -> ``"Q4_K_M"``)."""
    if value is None:
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return f"type {value}"
    return name.replace("MOSTLY_", "").replace("ALL_", "")


def _reader_class():
    import gguf

    class PlainReader(gguf.GGUFReader):
        """GGUFReader over a plain ndarray view of its memory map: numpy.memmap's
        bookkeeping on every slice makes parsing a 150k-token vocabulary ~4x
        slower (1.4 s instead of 5.3 s measured on a 152k-token file)."""

        # GGUFReader.data is a plain attribute: an override error where gguf is installed, none where it is not
        @property
        def data(self):  # type: ignore[override, unused-ignore]
            return self.__dict__["_plain_data"]

        @data.setter
        def data(self, value) -> None:
            self.__dict__["_plain_data"] = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainReader


_READER = None


def read_error(path: "os.PathLike[str] | str", exc: OSError) -> ModelLoadError:
    """Why ``path`` cannot be read; a broken link is said to be one."""
    if os.path.islink(path):
        return ModelLoadError(f"{path} is a broken link (to {os.readlink(path)})")
    return ModelLoadError(f"cannot read {path}: {exc.strerror or exc}")


def _open(path: str):
    global _READER
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise read_error(path, exc) from None
    if not stat.S_ISREG(mode):  # a FIFO would block the read below
        raise ModelLoadError(f"not a regular file: {path}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        what = "empty" if not magic else f"starts with {magic!r}"
        raise ModelLoadError(f"not a GGUF file ({what}): {path}")
    if _READER is None:
        _READER = _reader_class()
    try:
        return _READER(path)
    except Exception as exc:  # truncated or malformed header: gguf raises ValueError, IndexError, ...
        raise ModelLoadError(f"unreadable GGUF header ({type(exc).__name__}: {exc}): {path}") from None


def _value(fields: dict, key: str) -> Any:
    field = fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, UnicodeDecodeError, IndexError):
        return None


def _int(value: Any) -> Optional[int]:
    if isinstance(value, (list, tuple)):
        return None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _kv_bytes(fields: dict, arch: str) -> Optional[int]:
    n_layer = _int(_value(fields, f"{arch}.block_count"))
    n_embd = _int(_value(fields, f"{arch}.embedding_length"))
    n_head = _value(fields, f"{arch}.attention.head_count")
    n_head_kv = _value(fields, f"{arch}.attention.head_count_kv")
    if n_layer is None or n_head is None:
        return None
    heads = n_head if isinstance(n_head, list) else [n_head] * n_layer
    heads_kv = heads if n_head_kv is None else (
        n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer)
    first_head = next((int(h) for h in heads if h), 0)
    if not first_head or n_embd is None:
        return None
    k_len = _int(_value(fields, f"{arch}.attention.key_length")) or n_embd // first_head
    v_len = _int(_value(fields, f"{arch}.attention.value_length")) or n_embd // first_head
    return int(sum(int(h) for h in heads_kv[:n_layer]) * (k_len + v_len) * _KV_BYTES)


def _guess_file_type(tensors) -> Optional[str]:
    """The type holding most weights of the 2-D tensors, when general.file_type is absent."""
    counts: Counter = Counter()
    for t in tensors:
        if len(t.shape) >= 2:
            counts[t.tensor_type.name] += int(t.n_elements)
    return counts.most_common(1)[0][0] if counts else None


def read_gguf(path: PathLike, extra_parts: Sequence[PathLike] = ()) -> GGUFContents:
    """Parse the header of ``path`` (and the tensor descriptions of the other
    parts of a split file, ``extra_parts``, for the parameter count).

    Raises ModelLoadError naming the file when it is not a readable GGUF file.
    """
    spath = os.fspath(path)
    reader = _open(spath)
    fields = reader.fields
    arch = _value(fields, "general.architecture")
    arch = arch if isinstance(arch, str) else None
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    for part in extra_parts:
        n_params += sum(int(t.n_elements) for t in _open(os.fspath(part)).tensors)

    tokens = fields.get("tokenizer.ggml.tokens")
    texts = [tokens.parts[i].tobytes() for i in tokens.data] if tokens is not None else []
    tok_model = _value(fields, "tokenizer.ggml.model")
    tok_model = tok_model if isinstance(tok_model, str) else None
    vocab_type = VOCAB_TYPES.get(tok_model, tok_model) if tok_model else None
    default_bos, default_eos = _DEFAULT_SPECIAL.get(vocab_type or "", (None, None))
    bos = _int(_value(fields, "tokenizer.ggml.bos_token_id"))
    eos = _int(_value(fields, "tokenizer.ggml.eos_token_id"))
    bos = default_bos if bos is None else bos
    eos = default_eos if eos is None else eos
    n_vocab = len(texts) if tokens is not None else None
    if n_vocab is not None:  # as the engine does: an id outside the vocabulary is none
        bos = bos if bos is not None and 0 <= bos < n_vocab else None
        eos = eos if eos is not None and 0 <= eos < n_vocab else None

    file_type = file_type_name(_int(_value(fields, "general.file_type"))) or _guess_file_type(reader.tensors)
    name = _value(fields, "general.name")
    info = GGUFInfo(
        architecture=arch,
        model_name=name if isinstance(name, str) else None,
        file_type=file_type,
        n_params=n_params or None,
        n_vocab=n_vocab,
        vocab_type=vocab_type,
        tokenizer_model=tok_model,
        bos=bos,
        eos=eos,
        chat_template="tokenizer.chat_template" in fields,
        context_length=_int(_value(fields, f"{arch}.context_length")) if arch else None,
        kv_bytes_per_token=_kv_bytes(fields, arch) if arch else None,
        cut=_CUT_KEY in fields,
    )
    del reader, fields, tokens  # release the memory map
    return GGUFContents(info, texts)


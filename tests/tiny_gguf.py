"""Writers of tiny random-weight GGUF models for the engine tests.

The models use the ``llama`` architecture with F32 weights drawn from a seeded
numpy generator, so that llama.cpp runs them exactly like a real model, only
in microseconds.  Two tokenizers are available:

* ``"bpe"``: a GPT-2 style byte-level BPE vocabulary: the 256 byte symbols,
  merges for a few common English words, ChatML control tokens and a chat
  template.  ``<|begin_of_text|>`` is BOS (added when tokenizing),
  ``<|im_end|>`` is EOS and ``<|endoftext|>`` an end-of-turn token.
* ``"spm"``: a SentencePiece style vocabulary (``<unk>``, ``<s>``, ``</s>``,
  256 byte-fallback tokens, a few ``▁word`` pieces), mainly to have a second
  vocabulary *type*.

Ids past the core vocabulary up to ``n_vocab`` are filler tokens ``<xN>``
whose text depends only on the id, so two models with different ``n_vocab``
share the texts of their common ids (the "padded vocabulary" case).

Every tensor is drawn from a generator seeded by ``(seed, tensor name)``:
two models with the same seed share all tensors they have in common, e.g. a
one-layer draft shares the embeddings and first block of a two-layer target,
which makes their next-token distributions correlated (useful for
acceptance-rate tests).  ``noise`` adds an independent perturbation.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import gguf
import numpy as np

PathLike = Union[str, "os.PathLike[str]"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Words whose BPE merges the "bpe" vocabulary contains (with and without a
# leading space).
_WORDS = (
    "the", "and", "ing", "hello", "world", "is", "of", "to", "in", "it",
    "that", "for", "on", "with", "def", "return", "print",
)

BPE_SPECIALS = ("<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
SPM_WORDS = ("▁the", "▁and", "▁hello", "▁world", "▁is", "▁of", "▁to", "▁in", "▁it", "▁a")


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe_core() -> Tuple[List[str], List[int], List[str]]:
    """Texts, token types and merges of the core "bpe" vocabulary."""
    byte_chars = _bytes_to_unicode()
    texts = [byte_chars[b] for b in range(256)]
    seen = set(texts)
    merges: List[str] = []
    space = byte_chars[ord(" ")]

    def add(left: str, right: str) -> str:
        merged = left + right
        if merged not in seen:
            merges.append(f"{left} {right}")
            texts.append(merged)
            seen.add(merged)
        return merged

    for word in _WORDS:
        symbols = [byte_chars[b] for b in word.encode("utf-8")]
        cur = symbols[0]
        for sym in symbols[1:]:
            cur = add(cur, sym)
        # " word" = "Ġ" + "word", merged last so BPE finds it after "word"
        add(space, cur)
    types = [int(gguf.TokenType.NORMAL)] * len(texts)
    for special in BPE_SPECIALS:
        texts.append(special)
        types.append(int(gguf.TokenType.CONTROL))
    return texts, types, merges


def _spm_core() -> Tuple[List[str], List[int], List[float]]:
    texts = ["<unk>", "<s>", "</s>"]
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    for b in range(256):
        texts.append(f"<0x{b:02X}>")
        types.append(int(gguf.TokenType.BYTE))
    words = ["▁"] + list(SPM_WORDS)
    texts += words
    types += [int(gguf.TokenType.NORMAL)] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return texts, types, scores


def core_vocab_size(tokenizer: str = "bpe") -> int:
    """Number of ids of the core vocabulary (the minimum ``n_vocab``)."""
    return len(_bpe_core()[0]) if tokenizer == "bpe" else len(_spm_core()[0])


def filler_text(token_id: int) -> str:
    """Text of a filler id past the core vocabulary."""
    return f"<x{token_id}>"


def mismatched_ids(n_vocab: int, tokenizer: str = "bpe") -> List[int]:
    """The ids whose text the "mismatch" vocabulary variant changes."""
    core = core_vocab_size(tokenizer)
    ids = [core - len(BPE_SPECIALS) - 3] if tokenizer == "bpe" else [core - 2]
    if n_vocab > core + 5:
        ids.append(core + 5)
    return ids


def vocab_texts(n_vocab: int, *, tokenizer: str = "bpe", vocab_variant: str = "base") -> List[str]:
    """Token texts of a tiny model's vocabulary (what the GGUF stores)."""
    texts, _, _ = _vocab(n_vocab, tokenizer, vocab_variant)
    return texts


def _vocab(n_vocab: int, tokenizer: str, vocab_variant: str):
    if tokenizer == "bpe":
        texts, types, merges = _bpe_core()
        scores: Optional[List[float]] = None
    elif tokenizer == "spm":
        texts, types, scores = _spm_core()
        merges = []
    else:
        raise ValueError(f"tokenizer must be 'bpe' or 'spm', got {tokenizer!r}")
    core = len(texts)
    if n_vocab < core:
        raise ValueError(f"n_vocab must be >= {core} for the {tokenizer} vocabulary, got {n_vocab}")
    texts = list(texts) + [filler_text(i) for i in range(core, n_vocab)]
    types = list(types) + [int(gguf.TokenType.NORMAL)] * (n_vocab - core)
    if scores is not None:
        scores = list(scores) + [-100.0] * (n_vocab - core)
    if vocab_variant == "mismatch":
        for i in mismatched_ids(n_vocab, tokenizer):
            texts[i] = f"<changed{i}>"
    elif vocab_variant != "base":
        raise ValueError(f"vocab_variant must be 'base' or 'mismatch', got {vocab_variant!r}")
    return texts, types, (merges if tokenizer == "bpe" else scores)


def _rng(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _tensor(seed: int, name: str, shape: Sequence[int], scale: float, noise: float,
            noise_seed: int) -> np.ndarray:
    out = _rng(seed, name).standard_normal(shape, dtype=np.float32) * np.float32(scale)
    if noise:
        out += _rng(noise_seed, name).standard_normal(shape, dtype=np.float32) * np.float32(scale * noise)
    return out


def write_tiny_model(
    path: PathLike,
    *,
    n_vocab: int = 384,
    seed: int = 0,
    vocab_variant: str = "base",
    tokenizer: str = "bpe",
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: Optional[int] = None,
    n_ff: Optional[int] = None,
    n_ctx_train: int = 512,
    tie_embeddings: bool = False,
    output_scale: float = 0.5,
    noise: float = 0.0,
    noise_seed: int = 1,
    chat_template: Optional[str] = CHATML_TEMPLATE,
    add_bos: Optional[bool] = None,
    architecture: str = "llama",
    nan_token: Optional[int] = None,
    fim: Sequence[str] = (),
    user_tokens: Sequence[str] = (),
) -> Path:
    """Write a tiny llama-architecture GGUF model and return its path.

    ``output_scale`` is the standard deviation of the output projection (and
    embeddings): larger values give more peaked next-token distributions.
    ``architecture`` other than ``"llama"`` writes a file llama.cpp refuses
    (for load-error tests).  ``nan_token`` gives that token a NaN embedding:
    every position after it gets NaN logits (for bad-logits tests).
    ``fim`` names fill-in-the-middle tokens to declare (of ``pre``, ``suf``,
    ``mid``, ``pad``, ``rep``, ``sep``): the last ids of the vocabulary, in
    that order of the names given.  ``user_tokens`` are texts given ids of
    their own (user-defined tokens, as Qwen2.5's ``<tool_call>``), just
    below the fill-in-the-middle ones.
    """
    path = Path(path)
    if n_embd % n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    n_ff = 2 * n_embd if n_ff is None else n_ff
    head_dim = n_embd // n_head
    texts, types, extra = _vocab(n_vocab, tokenizer, vocab_variant)
    for i, text in enumerate(user_tokens):
        at = n_vocab - len(fim) - len(user_tokens) + i
        texts[at], types[at] = text, int(gguf.TokenType.USER_DEFINED)

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{tokenizer}-{n_vocab}-s{seed}-l{n_layer}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(0)  # all F32

    if tokenizer == "bpe":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(texts)
        writer.add_token_types(types)
        writer.add_token_merges(extra)
        writer.add_bos_token_id(texts.index("<|begin_of_text|>"))
        writer.add_eos_token_id(texts.index("<|im_end|>"))
        writer.add_add_bos_token(True if add_bos is None else add_bos)
    else:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(texts)
        writer.add_token_scores(extra)
        writer.add_token_types(types)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True if add_bos is None else add_bos)
    writer.add_add_eos_token(False)
    for i, name in enumerate(fim):
        writer.add_uint32(f"tokenizer.ggml.fim_{name}_token_id", n_vocab - len(fim) + i)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def t(name: str, shape: Sequence[int], scale: float) -> None:
        # numpy shape is (rows, cols) = ggml (ne1, ne0)
        writer.add_tensor(name, _tensor(seed, name, shape, scale, noise, noise_seed))

    def ones(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    embd = _tensor(seed, "token_embd.weight", (n_vocab, n_embd), output_scale, noise, noise_seed)
    if nan_token is not None:
        embd[nan_token] = np.nan
    writer.add_tensor("token_embd.weight", embd)
    ones("output_norm.weight", n_embd)
    if not tie_embeddings:
        t("output.weight", (n_vocab, n_embd), output_scale)
    w = 1.0 / np.sqrt(n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", n_embd)
        t(p + "attn_q.weight", (n_head * head_dim, n_embd), w)
        t(p + "attn_k.weight", (n_head_kv * head_dim, n_embd), w)
        t(p + "attn_v.weight", (n_head_kv * head_dim, n_embd), w)
        t(p + "attn_output.weight", (n_embd, n_head * head_dim), w)
        ones(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate.weight", (n_ff, n_embd), w)
        t(p + "ffn_up.weight", (n_ff, n_embd), w)
        t(p + "ffn_down.weight", (n_embd, n_ff), 1.0 / np.sqrt(n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated_copy(src: PathLike, dst: PathLike, *, keep_fraction: float = 0.6) -> Path:
    """Copy a GGUF file but cut its tensor data (the header stays intact)."""
    data = Path(src).read_bytes()
    dst = Path(dst)
    dst.write_bytes(data[: int(len(data) * keep_fraction)])
    return dst


def write_garbage(path: PathLike, content: bytes = b"this is not a GGUF model file\n" * 8) -> Path:
    path = Path(path)
    path.write_bytes(content)
    return path

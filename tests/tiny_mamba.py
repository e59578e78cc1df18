"""A tiny random-weight Mamba (recurrent) GGUF model, written with ``gguf``.

llama.cpp reports such a model as recurrent: its state cannot drop a suffix,
so it can never roll back rejected draft tokens.  It shares tiny_gguf's
vocabulary, so it is vocabulary-compatible with the tiny llama models.

The tensors are the ones llama.cpp's Mamba loader asks for (per layer:
``ssm_in``, ``ssm_conv1d`` weight and bias, ``ssm_x``, ``ssm_dt`` weight and
bias, ``ssm_a``, ``ssm_d``, ``ssm_out``, ``attn_norm``), with an inner size of
twice the embedding (the only expansion factor it supports).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np
from tiny_gguf import CHATML_TEMPLATE, PathLike, _tensor, _vocab


def write_tiny_mamba(path: PathLike, *, n_vocab: int = 384, seed: int = 0, n_embd: int = 32,
                     n_layer: int = 2, d_state: int = 8, d_conv: int = 4, dt_rank: int = 4) -> Path:
    """Write a tiny ``mamba`` GGUF model (byte-level BPE vocabulary, ChatML
    template) and return its path."""
    path = Path(path)
    d_inner = 2 * n_embd
    texts, types, merges = _vocab(n_vocab, "bpe", "base")

    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_name(f"tiny-mamba-{n_vocab}-s{seed}-l{n_layer}")
    writer.add_context_length(512)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(texts.index("<|begin_of_text|>"))
    writer.add_eos_token_id(texts.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    def t(name: str, shape: Sequence[int], scale: float) -> None:
        # numpy shape (rows, cols) = ggml (ne1, ne0)
        writer.add_tensor(name, _tensor(seed, name, shape, scale, 0.0, 0))

    def const(name: str, shape: Sequence[int], value: float) -> None:
        writer.add_tensor(name, np.full(shape, value, dtype=np.float32))

    t("token_embd.weight", (n_vocab, n_embd), 0.5)
    const("output_norm.weight", (n_embd,), 1.0)
    t("output.weight", (n_vocab, n_embd), 0.5)
    for i in range(n_layer):
        p = f"blk.{i}."
        const(p + "attn_norm.weight", (n_embd,), 1.0)
        t(p + "ssm_in.weight", (2 * d_inner, n_embd), 1.0 / np.sqrt(n_embd))
        t(p + "ssm_conv1d.weight", (d_inner, d_conv), 0.5)
        const(p + "ssm_conv1d.bias", (d_inner,), 0.0)
        t(p + "ssm_x.weight", (dt_rank + 2 * d_state, d_inner), 1.0 / np.sqrt(d_inner))
        t(p + "ssm_dt.weight", (d_inner, dt_rank), 0.5)
        const(p + "ssm_dt.bias", (d_inner,), 0.0)
        # A = -exp(A_log) < 0 keeps the state decaying (stable recurrence).
        const(p + "ssm_a", (d_inner, d_state), -1.0)
        const(p + "ssm_d", (d_inner,), 1.0)
        t(p + "ssm_out.weight", (n_embd, d_inner), 1.0 / np.sqrt(d_inner))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

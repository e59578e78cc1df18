"""Cheaper drafts cut from the default draft: what each costs and accepts.

    python -m bench.draft_variants [--threads 2] [--tokens 128]

At four and more concurrent requests the default pair's drafts do not pay
(bench/HISTORY.md, "What drafting can add"): the Q4_0 draft's pass over one
row per request costs too much of a target pass.  Two ways to make the same
draft cheaper, each exact (the verifier only needs the q a draft token was
sampled from; a draft that never proposes some ids has q = 0 there):

- ``vocab-N``: the output rows (Qwen2.5 ties them to the token embeddings,
  stored as Q8_0: a third of the draft's bytes) cut to the first N ids plus
  the control tokens: the decoders' ``draft_vocab=N`` (engine/vocab_cut.py).
  Byte-pair ids come roughly in merge order, so the first ids are the common
  ones.  The draft reads an id it lacks as a space.
- ``skip-L``: transformer layers L dropped (a self-speculative draft).

Each variant is written into a temporary folder.  Measured side
by side: the draft's pass time over b = 1..8 rows with every row's logits
(one batched drafting pass at b requests) and its mean acceptance
α = Σ min(p, q) at T = 1, per position of the text the default pair wrote
for the benchmark prompts (teacher-forced: the target and every draft read
the same tokens).  Then the batch planner's forecast gain over plain
batching at K = 1, 2, 4, 8 (``specdec_cpu.planning.forecast``) with the
target's calibrated pass times and each draft's own.  Writes
bench/results/draft_variants/draft_variants_results.json and prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import gguf
import numpy as np

from specdec_cpu import SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.demo_models import ensure_model
from specdec_cpu.planning.calibration import ensure_timings, time_passes
from specdec_cpu.planning.forecast import forecast

from .common import results_dir
from .prompts import PROMPTS

F32, Q4_0 = "qwen2.5-coder-0.5b-f32", "qwen2.5-coder-0.5b-q4_0"
BATCH = list(range(1, 9))
USERS = [1, 2, 4, 8]


def _copy_gguf(src: Path, dst: Path, field: Callable[[str, object], object],
               tensor: Callable[[str, np.ndarray], "tuple[str, np.ndarray] | None"]) -> None:
    """Write ``src`` to ``dst`` with its fields and tensors passed through the
    two functions (``tensor`` returns None to drop one)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = f.types[0]
        value = field(name, f.contents())
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, kind, sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, kind)
    for t in r.tensors:
        out = tensor(t.name, t.data)
        if out is not None:
            w.add_tensor(out[0], out[1], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def drop_layers(src: Path, dst: Path, layers: Sequence[int]) -> None:
    """A copy of ``src`` without the given transformer layers."""
    arch = gguf.GGUFReader(src).fields["general.architecture"].contents()
    n_layer = gguf.GGUFReader(src).fields[f"{arch}.block_count"].contents()
    renumber = {old: new for new, old in enumerate(i for i in range(n_layer) if i not in layers)}

    def field(name: str, value: object) -> object:
        return len(renumber) if name == f"{arch}.block_count" else value

    def tensor(name: str, data: np.ndarray):
        m = re.match(r"blk\.(\d+)\.(.*)", name)
        if not m:
            return name, data
        i = int(m.group(1))
        return (f"blk.{renumber[i]}.{m.group(2)}", data) if i in renumber else None

    _copy_gguf(src, dst, field, tensor)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _rows(ctx: engine.LlamaContext, prompt: List[int], answer: List[int], ids: Callable) -> np.ndarray:
    """The model's logits for every answer position, teacher-forced."""
    ctx.truncate(0)
    first = ctx.eval(ids(prompt), 1).copy()  # a view of the context's buffer, which the next eval reuses
    return np.concatenate([first, ctx.eval(ids(answer[:-1]), len(answer) - 1)])


def acceptance(target_rows: Sequence[np.ndarray], draft: engine.LlamaContext, keep: np.ndarray,
               texts: Sequence["tuple[list[int], list[int]]"]) -> float:
    """Mean Σ min(p, q) at T = 1 over every answer position of ``texts``
    (``keep``: the target id of each of the draft's columns; a cut draft's
    context reads the target's ids itself)."""
    alphas = []
    for (prompt, answer), t_rows in zip(texts, target_rows):
        q = _softmax(_rows(draft, prompt, answer, list))
        p = _softmax(t_rows)[:, keep]
        alphas.extend(np.minimum(p, q).sum(axis=1).tolist())
    return float(np.mean(alphas))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="answer length per prompt (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds over all drafts (default 3)")
    ap.add_argument("--output", default=str(results_dir("draft_variants") / "draft_variants_results.json"))
    args = ap.parse_args(argv)
    target_path, draft_path = ensure_model(F32), ensure_model(Q4_0)
    params = SamplingParams(temperature=1.0, seed=7, ignore_eos=True)

    with SpeculativeDecoder.from_gguf(target_path, draft_path, n_threads=args.threads, n_ctx=2048) as dec:
        texts = []
        for prompt in PROMPTS:
            gen = dec.chat(prompt.messages(), max_tokens=args.tokens, params=params)
            texts.append((dec.tokenizer.tokenize(dec.chat_prompt(prompt.messages())), gen.tokens))

    with tempfile.TemporaryDirectory() as tmp:
        variants: Dict[str, Path] = {"default": draft_path}
        for n in (32768, 65536, 98304):  # the decoders' draft_vocab=n (engine/vocab_cut.py)
            variants[f"vocab-{n // 1024}k"] = Path(engine.cut_vocab(draft_path, Path(tmp) / f"vocab{n}.gguf", n))
        for name, layers in (("skip-1", [18]), ("skip-3", [16, 18, 20])):
            variants[name] = Path(tmp) / f"{name}.gguf"
            drop_layers(draft_path, variants[name], layers)

        target_w = engine.LlamaWeights(target_path)
        target = engine.LlamaContext(target_w, n_ctx=2048, n_threads=args.threads)
        target_rows = [_rows(target, p, a, list) for p, a in texts]
        weights = {name: engine.LlamaWeights(path) for name, path in variants.items()}
        drafts = {name: engine.LlamaContext(w, n_ctx=2048, n_threads=args.threads) for name, w in weights.items()}
        calibration = ensure_timings(target, drafts["default"], target_path=str(target_path),
                                     draft_path=str(draft_path), n_threads=args.threads,
                                     k_max=64, b_max=16)
        ms: Dict[str, List[List[float]]] = {name: [] for name in variants}
        for _ in range(args.rounds):  # rounds interleave the drafts: a change of load hits all alike
            for name, ctx in drafts.items():
                ctx.truncate(0)
                ms[name].append(time_passes(ctx, BATCH, repeats=3))
        results = []
        for name, ctx in drafts.items():
            curve = [statistics.median(r[i] for r in ms[name]) for i in range(len(BATCH))]
            default = [statistics.median(r[i] for r in ms["default"]) for i in range(len(BATCH))]
            keep = weights[name].source_ids
            alpha = acceptance(target_rows, ctx, np.arange(weights[name].n_vocab) if keep is None else keep, texts)
            scale = [c / d for c, d in zip(curve, default)]
            batch_ms = [b_ms * scale[min(i, len(scale) - 1)] for i, b_ms in enumerate(calibration.draft_batch_ms)]
            model = dataclasses.replace(calibration, draft_ms=batch_ms[0], draft_batch_ms=batch_ms)
            gains = {f.users: round(f.gain, 3) for f in forecast(model, alpha, USERS)}
            results.append({"draft": name, "pass_ms": [round(x, 2) for x in curve],
                            "alpha_t1": round(alpha, 4), "forecast_gain_over_plain": gains})
            print(f"{name:12s} pass ms b=1,4,8: {curve[0]:6.1f} {curve[3]:6.1f} {curve[7]:6.1f}  "
                  f"α(T=1) {alpha:.3f}  forecast gain K=1,2,4,8: "
                  + " ".join(f"{gains[k]:.2f}" for k in USERS), flush=True)
        for ctx in (*drafts.values(), target):
            ctx.close()
        for w in (*weights.values(), target_w):
            w.close()

    out = {"command": "python -m bench.draft_variants " + " ".join(argv or []),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "threads": args.threads, "tokens": args.tokens,
           "target_ms_1_4_8": [round(calibration.target_ms[k - 1], 1) for k in (1, 4, 8)],
           "variants": results}
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

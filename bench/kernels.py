"""Benchmark of the vocabulary-wide sampling kernels.

    python -m bench.kernels [--repeats N] [--no-write]
    python -m bench.kernels --report-only bench/results/kernels/kernels_results.json

Times softmax (T = 1, against a numpy copy), T = 0.8 + top_p = 0.95 and
T = 0.8 + top_k = 40 (against an argsort-based numpy reference and llama.cpp's
sampler chain) and a γ = 8 verify where every row is accepted, for every
kernel ISA this CPU supports, at V = 32,000 / 151,936 / 262,144, on synthetic
rows and on logit rows captured from Qwen2.5-Coder-0.5B, interleaved call by
call.  Writes each time's median and minimum to
bench/results/kernels/kernels_results.json and the "## Kernels" section of
bench/RESULTS.md (``--report-only FILE`` re-renders).  A missed target is
reported, never a failure.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

from specdec_cpu import SamplingParams, sampling
from specdec_cpu.planning.costmodel import cpu_model

from .common import command_line, publish, results_dir

VOCABS = (32_000, 151_936, 262_144)
CACHE = Path(os.environ.get("SPECDEC_CACHE_DIR", Path.home() / ".cache" / "specdec-cpu"))
CAPTURE = CACHE / "bench" / "qwen2.5-coder-0.5b-logits.npy"
HEADING = "## Kernels"
N_ROWS = 8  # distinct rows cycled through, so no call sees a row hot from the previous one

P_SOFTMAX = SamplingParams(temperature=1.0)
P_TOPP = SamplingParams(temperature=0.8, top_p=0.95)
P_TOPK = SamplingParams(temperature=0.8, top_k=40)

PROMPT = (
    "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a Python function that parses a CSV file and returns the "
    "average of the numeric column called 'price', skipping bad rows.<|im_end|>\n"
    "<|im_start|>assistant\n```python\nimport csv\n\n\ndef average_price(path):\n"
    "    total = 0.0\n    count = 0\n    with open(path, newline='') as f:\n"
    "        for row in csv.DictReader(f):\n            try:\n"
)


def synthetic_rows(v: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(N_ROWS, v)) * 3.0).astype(np.float32)


def captured_rows() -> tuple[np.ndarray, str]:
    """The logits of the code prompt's last N_ROWS positions under the demo Q4_K_M model (cached)."""
    if CAPTURE.exists():
        return np.load(CAPTURE), f"cached {CAPTURE.name}"
    from specdec_cpu.demo_models import ensure_model

    from .suite import Q4_K_M

    model = ensure_model(Q4_K_M)
    llm = llama_cpp.Llama(str(model), n_ctx=512, n_batch=512, n_threads=os.cpu_count() or 1, logits_all=True,
                          verbose=False)
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    llm.eval(tokens)
    rows = np.array(llm.scores[len(tokens) - N_ROWS:len(tokens)], dtype=np.float32)
    llm.close()
    CAPTURE.parent.mkdir(parents=True, exist_ok=True)
    np.save(CAPTURE, rows)
    return rows, f"captured from {model.name}"


def fit_rows(rows: np.ndarray, v: int, seed: int = 1) -> np.ndarray:
    """Captured rows brought to vocabulary size v.

    Smaller v: keep each row's 1,000 largest logits plus a random choice of
    the others (so the head of the distribution survives).  Larger v: append
    logits resampled from the row's own values below its 1,000th largest
    (the row's own tail shape, more of it).
    """
    n, src = rows.shape
    if v == src:
        return np.ascontiguousarray(rows)
    g = np.random.default_rng(seed)
    out = np.empty((n, v), dtype=np.float32)
    for r in range(n):
        order = np.argsort(-rows[r], kind="stable")
        head, tail = order[:1000], order[1000:]
        if v < src:
            keep = np.concatenate([head, g.choice(tail, size=v - head.size, replace=False)])
            out[r] = rows[r][g.permutation(keep)]
        else:
            extra = rows[r][g.choice(tail, size=v - src, replace=True)]
            out[r] = np.concatenate([rows[r], extra])[g.permutation(v)]
    return out


def numpy_reference(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Argsort-based float32 reference of the same pipeline (temperature -> top-k -> top-p)."""
    z = row / np.float32(params.temperature)
    order = np.argsort(-z, kind="stable")
    zs = z[order]
    if params.top_k:
        zs = zs[: params.top_k]
    e = np.exp(zs - zs[0])
    ps = e / e.sum(dtype=np.float32)
    if params.top_p < 1.0:
        c = np.cumsum(ps)
        n = int(np.searchsorted(c, np.float32(params.top_p))) + 1
        ps = ps[:n] / ps[:n].sum(dtype=np.float32)
    out = np.zeros_like(row)
    out[order[: ps.size]] = ps
    return out


class LlamaChain:
    """llama.cpp's sampler chain over a llama_token_data_array: ``fill(row)`` writes ids and logits into it
    (as llama.cpp's common_sampler does for every token), ``apply()`` runs the chain and draws."""

    def __init__(self, v: int, params: SamplingParams, seed: int = 1234):
        lc = llama_cpp
        self.chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        # top-k commutes with temperature: put it first, as llama.cpp's default
        # chain does, so temperature only touches the k survivors.
        if params.top_k:
            lc.llama_sampler_chain_add(self.chain, lc.llama_sampler_init_top_k(params.top_k))
        lc.llama_sampler_chain_add(self.chain, lc.llama_sampler_init_temp(params.temperature))
        if params.top_p < 1.0:
            lc.llama_sampler_chain_add(self.chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(self.chain, lc.llama_sampler_init_dist(seed))
        self.v = v
        self.buf = np.zeros(v, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self.ids = np.arange(v, dtype=np.int32)
        self.arr = lc.llama_token_data_array(
            data=self.buf.ctypes.data_as(lc.llama_token_data_p), size=v, selected=-1, sorted=False
        )
        self.ref = ctypes.byref(self.arr)

    def fill(self, row: np.ndarray) -> None:
        self.buf["id"] = self.ids
        self.buf["logit"] = row
        self.arr.size = self.v
        self.arr.selected = -1
        self.arr.sorted = False

    def apply(self) -> int:
        llama_cpp.llama_sampler_apply(self.chain, self.ref)
        return int(self.buf["id"][self.arr.selected])

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.chain)


def timed(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def run_case(rows: np.ndarray, repeats: int, isas: list[str]) -> dict[str, list[float]]:
    """All timings for one set of rows, interleaved call by call (µs)."""
    v = rows.shape[1]
    gamma = 8
    g = np.random.default_rng(7)
    vt = np.ascontiguousarray(np.stack([rows[i % rows.shape[0]] for i in range(gamma + 1)]))  # 9 target rows

    def drafted(params: SamplingParams) -> tuple[SamplingParams, np.ndarray, np.ndarray]:
        """q = the target's own distributions (so every row is accepted) and tokens drawn from it."""
        q = np.ascontiguousarray(sampling.distribution(vt[:gamma], params))
        q64 = q.astype(np.float64)
        return params, q, np.array([g.choice(v, p=q64[j] / q64[j].sum()) for j in range(gamma)], dtype=np.int32)

    verifies = {"verify8": drafted(P_TOPP), "verify8 plain": drafted(P_SOFTMAX)}
    truncations = {"topp": P_TOPP, "topk": P_TOPK}
    chains = {key: LlamaChain(v, params) for key, params in truncations.items()}
    times: dict[str, list[float]] = {}
    rng = sampling.Rng(42, sampling.DRAFT_STREAM)
    vrng = sampling.Rng(42, sampling.VERIFY_STREAM)

    def add(key: str, us: float) -> None:
        times.setdefault(key, []).append(us)

    def verify(params: SamplingParams, q: np.ndarray, tokens: np.ndarray) -> None:
        res = sampling.verify(vt, tokens, q, params, vrng)
        assert res.n_accepted == gamma, res

    for rep in range(repeats + 2):  # two warm-up rounds, discarded below
        row = rows[rep % rows.shape[0]]
        add("copy", timed(lambda: row.copy()))
        for key, params in truncations.items():
            add(f"numpy {key}", timed(lambda: numpy_reference(row, params)))
        for key, chain in chains.items():
            add(f"llama {key} fill", timed(lambda: chain.fill(row)))
            add(f"llama {key} apply", timed(chain.apply))
        for isa in isas:
            sampling.set_isa(isa)
            add(f"{isa} softmax", timed(lambda: sampling.distribution(row, P_SOFTMAX)))
            for key, params in truncations.items():
                add(f"{isa} {key} dist", timed(lambda: sampling.distribution(row, params)))
                add(f"{isa} {key} sample", timed(lambda: sampling.sample(row, params, rng)))
            for key, drafts in verifies.items():
                add(f"{isa} {key}", timed(lambda: verify(*drafts)))
    for key, chain in chains.items():
        chain.close()
        times[f"llama {key} total"] = [a + b for a, b in zip(times[f"llama {key} fill"], times[f"llama {key} apply"])]
    return {k: t[2:] for k, t in times.items()}


def check_agreement(rows: np.ndarray) -> float:
    """Largest |ours - numpy reference| at top-p and top-k over the first two rows: a sanity check."""
    worst = 0.0
    for row in rows[:2]:
        for params in (P_TOPP, P_TOPK):
            worst = max(worst, float(np.abs(sampling.distribution(row, params) - numpy_reference(row, params)).max()))
    return worst


def summary(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each implementation's ``[median, min]`` µs per call, as the results file keeps them."""
    return {k: [statistics.median(ts), min(ts)] for k, ts in times.items()}


def fmt(t: list[float]) -> str:
    return f"{t[0]:,.0f} / {t[1]:,.0f}"


def times_str(r: float) -> str:
    return f"{r:.1f}×" if r >= 10 else f"{r:.2f}×"


def render(results: dict, data: str = "kernels_results.json") -> str:
    """The "## Kernels" section of a run; ``data`` links its results file."""
    isas, m = results["isas"], results["machine"]
    best = isas[-1]
    lines = [
        HEADING, "", f"Command: `{results['command']}` (every time is in [kernels_results.json]({data}))", "",
        f"Machine: {m['cpu']}, {m['cpus']} logical CPUs; kernel ISAs supported here: "
        f"{', '.join(isas)} (default {results['default_isa']}); kernels and llama.cpp's sampler are single-threaded. "
        f"numpy {m['numpy']}, llama-cpp-python {m['llama_cpp_python']}, Python {m['python']}.", "",
        "Times are µs per call, `median / min` over the repeats, all implementations interleaved "
        "call by call in one run. Rows: " + "; ".join(results["rows"]) + ".", "",
        "- softmax: `distribution()` at T = 1, no truncation; *copy* is `row.copy()` (one read + one write pass).",
        "- top-p: T = 0.8, top_p = 0.95; top-k: T = 0.8, top_k = 40. *dist* is `distribution()` (full "
        "float32 row out), *sample* is `sample()` (one token). *numpy* is an argsort-based float32 "
        "reference of the same pipeline. *llama.cpp* is `llama_sampler_chain` (temp -> top_p -> "
        "dist, or top_k -> temp -> dist, its own faster order for the same result) applied to a "
        "`llama_token_data_array`: *apply* is the chain alone, *total* adds "
        "writing ids and logits into the candidate array from the row (two strided numpy passes), "
        "which llama.cpp's own sampling loop also pays per token.",
        "- verify γ=8: `verify()` over 9 target rows with q = the target rows' own distributions "
        "(at T = 0.8 + top_p = 0.95, and at T = 1 without truncation), so all 8 are accepted and a "
        "bonus token is drawn: 9 distributions, 8 acceptance sums and one draw.",
        "",
    ]
    head = ["V", "rows", "op", "numpy / copy", "llama.cpp apply", "llama.cpp total"] + [f"ours {i}" for i in isas]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(*cells: str) -> None:
        lines.append("| " + " | ".join(cells) + " |")

    for case in results["cases"]:
        v, kind, t = f"{case['v']:,}", case["kind"], case["times"]

        def ours(key: str) -> list[str]:
            return [fmt(t[f"{isa} {key}"]) for isa in isas]

        row(v, kind, "softmax", "copy " + fmt(t["copy"]), "", "", *ours("softmax"))
        for op, key in (("top-p", "topp"), ("top-k", "topk")):
            row(v, kind, f"{op} dist", fmt(t[f"numpy {key}"]), "", "", *ours(f"{key} dist"))
            row(v, kind, f"{op} sample", "", fmt(t[f"llama {key} apply"]), fmt(t[f"llama {key} total"]),
                *ours(f"{key} sample"))
        row(v, kind, "verify γ=8, T=0.8 top-p", "", "", "", *ours("verify8"))
        row(v, kind, "verify γ=8, T=1", "", "", "", *ours("verify8 plain"))

    lines += ["", f"Targets at V = 262,144 (medians, ours = {best}):", "", "| rows | target | measured | met |",
              "|---|---|---|---|"]
    for case in results["cases"]:
        if case["v"] != 262_144:
            continue
        med = {k: v[0] for k, v in case["times"].items()}
        r = med["numpy topp"] / med[f"{best} topp dist"]
        checks = [("top-p dist ≥ 20× faster than numpy", times_str(r), r >= 20)]
        for op, key, goal in (("top-p", "topp", 10), ("top-k", "topk", 2)):
            for what in ("apply", "total"):
                r = med[f"llama {key} {what}"] / med[f"{best} {key} sample"]
                checks.append((f"{op} sample ≥ {goal}× faster than llama.cpp ({what})", times_str(r), r >= goal))
        r = med[f"{best} softmax"] / med["copy"]
        checks.append(("softmax ≤ 4× a numpy copy", times_str(r), r <= 4))
        for key, label in (("verify8", "T=0.8, top_p=0.95"), ("verify8 plain", "T=1")):
            ms = med[f"{best} {key}"] / 1e3
            checks.append((f"verify γ=8 ({label}) < 1.5 ms", f"{ms:.3f} ms", ms < 1.5))
        for what, got, ok in checks:
            lines.append(f"| {case['kind']} | {what} | {got} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines) + "\n"


def measure(args: argparse.Namespace, command: str) -> dict:
    """Every case of one run, as the results file keeps it."""
    isas = sampling.supported_isas()
    default_isa = sampling.active_isa()
    captured, how = captured_rows()
    rows_note = ["*synthetic*: N(0, 1) × 3 logits, 8 rows",
                 f"*qwen*: 8 logit rows of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) at the last positions of a code "
                 f"prompt ({how}, vocabulary {captured.shape[1]:,}); for other V they are subsampled (each row's "
                 f"top 1,000 kept) or padded with values resampled from the row's own tail (marked qwen*)"]
    cases = []
    for v in args.vocab:
        qwen = "qwen" + ("" if v == captured.shape[1] else "*")
        for kind, rows in (("synthetic", synthetic_rows(v)), (qwen, fit_rows(captured, v))):
            sampling.set_isa(default_isa)
            print(f"V={v:,} {kind}: max |ours - numpy| = {check_agreement(rows):.2e}", file=sys.stderr)
            cases.append({"v": v, "kind": kind, "times": summary(run_case(rows, args.repeats, isas))})
    sampling.set_isa(default_isa)
    machine = {"cpu": cpu_model(), "cpus": os.cpu_count(), "numpy": np.__version__,
               "llama_cpp_python": llama_cpp.__version__, "python": platform.python_version()}
    return {"command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": machine, "isas": isas, "default_isa": default_isa, "rows": rows_note, "cases": cases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=101, help="timed calls per implementation and row set")
    ap.add_argument("--vocab", type=int, nargs="*", default=list(VOCABS), help="vocabulary sizes")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    ap.add_argument("--output-dir", type=Path, default=results_dir("kernels"))
    ap.add_argument("--report-only", type=Path, default=None, metavar="RESULTS.json")
    args = ap.parse_args(argv)
    results = (json.loads(args.report_only.read_text()) if args.report_only is not None
               else measure(args, command_line("python -m bench.kernels", argv)))
    if args.no_write:
        print(render(results))
        return 0
    publish("kernels", results, render, HEADING, output_dir=args.output_dir, name="kernels_results.json",
            report_only=args.report_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One decoder, one timed generation, under whichever checkout's Python runs it.

    PYTHON bench/ab_worker.py --target T.gguf [--draft D.gguf] --gamma auto|N [--tokens 128] < request.json

The worker of bench/ab.py and bench/first_use.py.  It imports nothing from
``bench`` and only the public API of ``specdec_cpu``, so that it runs under
an older checkout too; model paths come as arguments (where the demo models
are found has moved between versions).

stdin: ``{"prompt": text, "temperature": T, "top_p": p, "top_k": k, "min_p": m,
"seed": s}`` (the prompt already templated).  The decoder loads (the
calibration store is ``$SPECDEC_CALIBRATION_DIR``), runs an 8-token warm-up
unless ``--no-warmup``, then ``--tokens`` tokens with ``ignore_eos`` (0: load
only).  stdout: one JSON line.
"""

import argparse
import json
import statistics
import sys
import time

WARM_PROMPT = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default=None, help="draft model (none: plain decoding, γ must be 0)")
    ap.add_argument("--gamma", default="auto", help="auto or an integer")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens of the timed generation (0: load only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--calibration", default="auto", help="auto, cached or none")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    args = ap.parse_args()
    request = json.loads(sys.stdin.read() or "{}")

    import specdec_cpu
    from specdec_cpu import SamplingParams, SpeculativeDecoder

    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    calibration = None if args.calibration == "none" else args.calibration
    progress = []
    t0 = time.perf_counter()
    dec = SpeculativeDecoder.from_gguf(
        args.target, args.draft, gamma=gamma, n_ctx=args.n_ctx, n_threads=args.threads,
        calibration=calibration, progress=lambda msg: progress.append([round(time.perf_counter() - t0, 3), msg]))
    out = {"load_s": time.perf_counter() - t0, "progress": progress,
           "version": getattr(specdec_cpu, "__version__", "?"),
           "calibrated": getattr(dec, "cost_model", None) is not None}
    if args.tokens > 0:
        if args.warmup:
            dec.generate(WARM_PROMPT, max_tokens=8, params=SamplingParams(temperature=0.0, ignore_eos=True))
        params = SamplingParams(temperature=request.get("temperature", 0.0), top_p=request.get("top_p", 1.0),
                                top_k=request.get("top_k", 0), min_p=request.get("min_p", 0.0),
                                seed=request.get("seed"), ignore_eos=True)
        t1 = time.perf_counter()
        gen = dec.generate(request["prompt"], max_tokens=args.tokens, params=params)
        wall = time.perf_counter() - t1
        s = gen.stats
        out.update({
            "tokens": s.tokens, "wall_s": wall, "tps": s.tokens_per_second, "wall_tps": s.tokens / wall,
            "prompt_s": s.prompt_seconds, "decode_s": s.decode_seconds, "steps": s.steps,
            "drafted": s.drafted, "accepted": s.accepted,
            "mean_gamma": statistics.fmean(s.gammas) if s.gammas else 0.0, "first_gammas": list(s.gammas[:8]),
            "mean_alpha": s.mean_alpha if s.drafted else None,
        })
    if hasattr(dec, "close"):
        dec.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

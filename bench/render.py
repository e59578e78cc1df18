"""Re-render the whole of bench/RESULTS.md from the results files under bench/results/.

    python -m bench.render           # rewrite bench/RESULTS.md
    python -m bench.render --check   # exit 1, with a diff, when RESULTS.md is not what its results give

Every section is made by its study's own ``render`` from the file it
names, in the order below; nothing is run and no plot is redrawn (a study's
``--report-only`` redraws its plots).  tests/test_results_md.py runs the
check, so a table edited by hand, or a results file changed without its
section, fails the tests.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

from .common import RESULTS_MD, link, results_dir

TITLE = "# Benchmark results"


def _load(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text())


def _suite() -> str:
    from . import report

    out = results_dir("suite")
    plots = {k: link(out / name) for k, name in report.PLOT_FILES.items() if (out / name).exists()}
    return report.render(_load(out / "results.json"), plots, link(out / "results.json"))


def _published(study: str, name: str) -> str:
    """A study that writes its section with ``common.publish``: ``render(results, link)``."""
    path = results_dir(study) / name
    return importlib.import_module(f"bench.{study}").render(_load(path), link(path))


def _serving(name: str) -> str:
    from . import serving

    return serving.render(_load(results_dir("serving") / name), results_dir("serving"), RESULTS_MD)


def _layer_latency(name: str) -> str:
    from . import layer_latency

    path = results_dir("layer_latency") / name
    return layer_latency.render(_load(path), path, RESULTS_MD)


def _audit() -> str:
    from . import audit

    out = results_dir("audit")
    plot = out / "plot_audit.png"
    return audit.render(_load(out / "results.json"), link(plot) if plot.exists() else None, out)


#: Every section of RESULTS.md, in its order.
SECTIONS: List[Callable[[], str]] = [
    _suite,  # "End-to-end decoding" and "Targets"
    lambda: _published("kernels", "kernels_results.json"),
    lambda: _serving("serving_http_results.json"),
    lambda: _serving("serving_http_t1_results.json"),
    lambda: _serving("serving_ray_results.json"),
    lambda: _layer_latency("layer_latency_results.json"),
    lambda: _layer_latency("layer_latency_fresh_results.json"),
    lambda: _serving("serving_results.json"),
    _audit,
    lambda: _published("first_use", "first_use_results.json"),
    lambda: _published("infill", "infill_results.json"),
    lambda: _published("structured", "structured_results.json"),
]


def rendered() -> str:
    """RESULTS.md as the results files give it."""
    return "\n\n".join([TITLE, *(s().strip() for s in SECTIONS)]) + "\n"


def difference(text: str) -> List[str]:
    """The unified diff from bench/RESULTS.md to ``text`` (empty when they agree)."""
    return list(difflib.unified_diff(RESULTS_MD.read_text().splitlines(), text.splitlines(),
                                     "bench/RESULTS.md", "rendered from bench/results/", lineterm="", n=1))


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with bench/RESULTS.md instead of writing it")
    args = ap.parse_args(argv)
    text = rendered()
    if not args.check:
        RESULTS_MD.write_text(text)
        print(f"wrote {RESULTS_MD}", file=sys.stderr)
        return 0
    diff = difference(text)
    print("\n".join(diff[:200]) if diff else "bench/RESULTS.md is what bench/results/ gives")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())

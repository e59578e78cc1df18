"""What every study of the bench shares: where results go, paired ratios
with bootstrap intervals, RESULTS.md sections, and the machine a run was on.

Each study (``python -m bench.<study>``) writes its result files under
``bench/results/<study>/`` and its own "## " section of bench/RESULTS.md,
which links them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

BENCH = Path(__file__).resolve().parent
RESULTS_MD = BENCH / "RESULTS.md"

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130


def results_dir(study: str) -> Path:
    """``bench/results/<study>/``, where a study's result files and plots go."""
    return BENCH / "results" / study


def results_md_for(output_dir: Path, default_dir: Path) -> Path:
    """The RESULTS.md a study writes: bench/RESULTS.md for its default output
    directory, else one of the output directory's own (a focused run)."""
    if Path(output_dir).resolve() == Path(default_dir).resolve():
        return RESULTS_MD
    return Path(output_dir) / "RESULTS.md"


def publish(study: str, results: Dict[str, Any], render: Callable[[Dict[str, Any], str], str], heading: str, *,
            output_dir: Path, name: str, report_only: Optional[Path] = None, after: Optional[str] = None,
            results_md: Optional[Path] = None) -> str:
    """Write a study's ``results`` to ``output_dir/name`` (not when re-rendering
    ``report_only``) and its section of ``results_md`` (default: ``results_md_for``),
    linking the file.  ``render(results, link)`` makes the section.  Returns the section."""
    path = Path(report_only) if report_only is not None else Path(output_dir) / name
    if report_only is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    results_md = Path(results_md) if results_md is not None else results_md_for(output_dir, results_dir(study))
    results_md.parent.mkdir(parents=True, exist_ok=True)
    section = render(results, link(path, results_md))
    write_section(results_md, section, heading, after)
    wrote = "rendered" if report_only is not None else f"wrote {path} and"
    print(f"{wrote} the '{heading}' section of {results_md}", file=sys.stderr)
    return section


def say(text: str) -> None:
    """A progress line on stderr, with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def quote(s: str) -> str:
    """``s`` as a shell word."""
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def command_line(prog: str, argv: Optional[Sequence[str]]) -> str:
    """How a study was run, as results record it: ``prog`` and its arguments (``sys.argv``'s by default)."""
    return " ".join([prog, *(quote(a) for a in (sys.argv[1:] if argv is None else argv))])


@functools.lru_cache(maxsize=1)
def pair_tokenizer() -> Any:
    """The demo pair's vocabulary (read from the draft file: smaller, the same vocabulary)."""
    from specdec_cpu.demo_models import ensure_model
    from specdec_cpu.engine import LlamaTokenizer, LlamaWeights

    from .suite import Q4_0

    return LlamaTokenizer(LlamaWeights(str(ensure_model(Q4_0))))


def redact_calibration(data: Dict[str, Any]) -> Dict[str, Any]:
    """A calibration record with its model files named, not where this machine keeps them."""
    for role in ("target", "draft"):
        if isinstance(data.get(role), dict) and data[role].get("path"):
            data[role]["path"] = f"<cache>/models/{Path(data[role]['path']).name}"
    return data


def link(path: Path, results_md: Path = RESULTS_MD) -> str:
    """``path`` as a link target written in ``results_md``."""
    return os.path.relpath(Path(path).resolve(), Path(results_md).resolve().parent)


# ---------------------------------------------------------------------------
# statistics over blocks
# ---------------------------------------------------------------------------


def median(xs: Iterable[Optional[float]]) -> Optional[float]:
    v = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(v) if v else None


def fmt(x: Optional[float], digits: int = 1) -> str:
    """A table cell: ``x`` to ``digits`` decimals, "–" for None."""
    return "–" if x is None else f"{x:.{digits}f}"


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> Optional[Tuple[float, float]]:
    """Percentile bootstrap interval of the median of ``values`` (blocks resampled
    with replacement, a fixed seed so that a report renders the same twice).
    None for fewer than 2 values."""
    v = [x for x in values if x is not None]
    if len(v) < 2:
        return None
    rng = random.Random(seed)
    n = len(v)
    meds = sorted(statistics.median(rng.choices(v, k=n)) for _ in range(resamples))
    a = (1.0 - level) / 2.0
    lo = meds[int(math.floor(a * resamples))]
    hi = meds[min(resamples - 1, int(math.ceil((1.0 - a) * resamples)) - 1)]
    return lo, hi


def stat(values: Sequence[float]) -> Dict[str, Any]:
    """Median of per-block values with its bootstrap interval."""
    v = [x for x in values if x is not None]
    ci = bootstrap_ci(v)
    return {"median": median(v), "lo": ci[0] if ci else None, "hi": ci[1] if ci else None, "n": len(v)}


def paired_ratios(runs: Sequence[Dict[str, Any]], a: str, b: str, setting: str, key: str = "tps") -> List[float]:
    """key(a) / key(b) for every block of ``setting`` where both engines ran."""
    by_block: Dict[Any, Dict[str, float]] = {}
    for r in runs:
        if r["setting"] == setting and r.get(key):
            by_block.setdefault(r["block"], {})[r["engine"]] = r[key]
    return [d[a] / d[b] for d in by_block.values() if a in d and b in d]


def rotated(engines: Sequence[Any], block: int) -> List[Any]:
    """The engines in the order of one block: rotated by one from block to
    block, so that a change of machine load hits every engine alike."""
    k = block % len(engines)
    return list(engines[k:]) + list(engines[:k])


def paired_run(run: Callable[[], Dict[str, Any]], errors: Tuple[type, ...], **fields: Any) -> Dict[str, Any]:
    """One engine's run in a block: ``run()``'s record (or the error it raised,
    of ``errors``, with ``tps`` None), then ``fields``, its wall time and the
    CPU others used meanwhile."""
    meter, load, t0 = CpuMeter(), load_average(), time.perf_counter()
    try:
        rec = run()
    except errors as exc:
        rec = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}", "tps": None}
    rec.update(fields, run_s=time.perf_counter() - t0, others_cores=meter.others(),
               load_1min=load[0] if load else None)
    return rec


def ratio_text(ratios: Sequence[float]) -> str:
    """The median ratio and its bootstrap 95% interval, as a table cell."""
    if not ratios:
        return "–"
    ci = bootstrap_ci(ratios)
    return f"{statistics.median(ratios):.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


# ---------------------------------------------------------------------------
# RESULTS.md
# ---------------------------------------------------------------------------


def write_section(path: Path, section: str, heading: str, after: Optional[str] = None) -> None:
    """Replace this module's "## " section of RESULTS.md in place, keeping
    the others where they are; a new section goes right after the section
    ``after`` (if present), else at the end."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("## ")] + [len(lines)]
    spans = {lines[a].strip(): (a, b) for a, b in zip(starts, starts[1:])}
    new = section.rstrip().splitlines() + [""]
    if heading in spans:
        a, b = spans[heading]
    elif after in spans:
        a = b = spans[after][1]
    else:
        a = b = len(lines)
        new = [""] + new
    path.write_text("\n".join(lines[:a] + new + lines[b:]).rstrip() + "\n")


def notes_of(results_file: Path) -> List[str]:
    """What whoever ran a study read in its results: ``<results file stem>.notes.md``
    beside the file, kept by hand and rendered at the end of the study's section
    (the tables above it are generated, the notes say what they mean)."""
    path = Path(results_file)
    notes = path.with_name(path.stem + ".notes.md")
    return [notes.read_text().strip(), ""] if notes.exists() else []


# ---------------------------------------------------------------------------
# the machine and the software a run was on
# ---------------------------------------------------------------------------


def machine_info(threads: int) -> Dict[str, Any]:
    from specdec_cpu import sampling
    from specdec_cpu.planning.costmodel import cpu_model

    info: Dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "isa": sampling.active_isa(),
        "isas_supported": list(sampling.supported_isas()),
        "threads": threads,
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
    }
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gb"] = round(kb / 1024 ** 2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return info


def versions(peer_paths: Optional[Dict[str, Path]]) -> Dict[str, Any]:
    import llama_cpp
    import numpy

    import specdec_cpu

    out: Dict[str, Any] = {
        "specdec_cpu": getattr(specdec_cpu, "__version__", "?"),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "numpy": numpy.__version__,
    }
    try:
        import matplotlib
        out["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    root = BENCH.parent
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", ".",
                                    ":(exclude)bench"], capture_output=True, text=True,
                                   timeout=30).stdout.strip()
            if head:
                out["specdec_cpu_git"] = head + (" with uncommitted changes outside bench/" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    if peer_paths:
        try:
            proc = subprocess.run([str(peer_paths["plain"]), "--version"], capture_output=True,
                                  text=True, timeout=30)
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            out["llama_cpp"] = next((ln for ln in lines if ln.startswith("version")), lines[0] if lines else "?")
        except (OSError, subprocess.SubprocessError):
            out["llama_cpp"] = "?"
        info = peer_paths["plain"].parent / "BUILD-INFO.json"
        if info.is_file():
            try:
                out["peer_build"] = json.loads(info.read_text())
            except ValueError:
                pass
    return out


# ---------------------------------------------------------------------------
# the previous main, for the side-by-side benchmarks (bench/ab.py, bench/serving.py)
# ---------------------------------------------------------------------------

#: Where a checkout-against-previous-main run writes its results and section: the evidence
#: for one change, which bench/HISTORY.md cites, not a current result of bench/RESULTS.md.
AB_RESULTS_MD = results_dir("ab") / "RESULTS.md"

#: Where a side-by-side benchmark finds the Python of the checkout to compare
#: with, when no ``--baseline-python`` is given.
BASELINE_PYTHON_ENV = "SPECDEC_BASELINE_PYTHON"


def baseline_python(value: Optional[str]) -> Optional[str]:
    """The baseline checkout's Python: ``value`` (``--baseline-python``), else $SPECDEC_BASELINE_PYTHON."""
    return value or os.environ.get(BASELINE_PYTHON_ENV) or None


def baseline_versions(python: str) -> Dict[str, Any]:
    """The specdec_cpu version and git commit that ``python`` imports (no paths)."""
    code = ("import json, os, specdec_cpu as s; "
            "print(json.dumps([getattr(s, '__version__', '?'), os.path.dirname(s.__file__)]))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} cannot import specdec_cpu: {proc.stderr.strip().splitlines()[-1:]}")
    version, where = json.loads(proc.stdout.strip().splitlines()[-1])
    out: Dict[str, Any] = {"specdec_cpu": version}
    git = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if git.returncode == 0 and git.stdout.strip():
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        out["specdec_cpu_git"] = git.stdout.strip() + (" with uncommitted changes" if dirty else "")
    return out


def redact_baseline(argv: Sequence[str]) -> List[str]:
    """A command line as recorded in results: the baseline Python's path written as PATH."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("PATH")
        elif a.startswith("--baseline-python="):
            out.append("--baseline-python=PATH")
        else:
            out.append(a)
        hide = a == "--baseline-python"
    return out


class CpuMeter:
    """CPU time other processes used: (all busy time − ours) per second of wall time.

    The load average cannot tell our own two busy threads from someone
    else's; /proc/stat minus this process's (and its waited-for children's)
    CPU time can.  A llama-server is not a waited-for child, so the run of a
    server engine names its pid in ``pids``: its CPU time is the engine's,
    not another process's.  Returns None where /proc/stat is unavailable.
    """

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._pids = tuple(pids)
        self._start = self._sample()

    def _pid_seconds(self, pid: int) -> float:
        """utime + stime of a running process (0 once it is gone)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self._hz
        except (OSError, ValueError, IndexError):
            return 0.0

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(v[:3]) + sum(v[5:8])  # user nice system + irq softirq steal
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system + sum(map(self._pid_seconds, self._pids))
        return time.monotonic(), busy / self._hz, own

    def restart(self) -> None:
        self._start = self._sample()

    def others(self) -> Optional[float]:
        """Cores' worth of CPU used by other processes since the last restart."""
        end = self._sample()
        if end is None or self._start is None or end[0] - self._start[0] <= 0:
            return None
        wall = end[0] - self._start[0]
        return max(((end[1] - self._start[1]) - (end[2] - self._start[2])) / wall, 0.0)


#: Other processes using more than this many cores count as contention.
BUSY_CORES = 0.25


def wait_until_quiet(progress: Any, budget: List[float], per_block: float = 60.0) -> Optional[float]:
    """Before a block: sample others' CPU use for 2 s; while it exceeds
    BUSY_CORES, wait (at most ``per_block`` seconds, and no more than what is
    left of the run's ``budget[0]``).  Returns the last sample."""
    meter = CpuMeter()
    time.sleep(2.0)
    others = meter.others()
    waited = 0.0
    while others is not None and others > BUSY_CORES and waited < per_block and budget[0] > 0:
        if waited == 0.0:
            progress.say(f"other processes are using {others:.2f} cores: waiting for a quieter machine "
                         f"(up to {min(per_block, budget[0]):.0f} s)")
        meter.restart()
        time.sleep(5.0)
        waited += 5.0
        budget[0] -= 5.0
        others = meter.others()
    return others


def load_average() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None

"""llama.cpp's command-line tools as engines, and the build of every llama.cpp binary.

The binaries are built once, from the llama.cpp sources vendored in the pinned
``llama-cpp-python`` sdist (so they run the very same llama.cpp revision as our
engine), and cached under ``<cache>/peers/llama.cpp-<llama-cpp-python version>/``:

- ``plain``: ``llama-completion`` (non-interactive single-prompt generation;
  ``llama-cli`` in this revision is a chat front-end built with the server);
- ``speculative``: ``llama-speculative`` (draft model, rejection sampling
  with the draft's probabilities);
- ``speculative-simple``: ``llama-speculative-simple`` (greedy draft proposals
  checked by sampling the target and comparing);
- ``server``: ``llama-server``, run by bench/engines/llama_server.py.

:func:`run_plain` and :func:`run_speculative` return the numbers each tool
prints about itself (decode-only tokens/s, drafted/accepted counts) together
with the wall time and the raw output, so the suite can compare like with
like.  :class:`SpeculativeTool` is the exactness audit's adapter: it reads the
ids the speculative tools sampled from their debug log.  Nothing here asserts
a time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, TextIO, Union

from specdec_cpu.paths import cache_dir

from .base import N_CTX, Ctx, Engine, Job, Sample, cut, quote, short_paths

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

#: The llama-cpp-python release whose vendored llama.cpp the peers are built from.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

#: Peer role -> CMake target / binary name.
PEER_BINARIES: Dict[str, str] = {
    "plain": "llama-completion",
    "speculative": "llama-speculative",
    "speculative-simple": "llama-speculative-simple",
    "server": "llama-server",
}

#: CMake cache entries used for the peer build.  GGML_NATIVE stays at its
#: default (on): the peers are a local benchmark tool, not something we ship.
#: ``llama-server`` lives in tools/server and needs LLAMA_BUILD_TOOLS and
#: LLAMA_BUILD_SERVER (LLAMA_BUILD_APP is the unified ``llama`` binary, not
#: needed).  Its web UI is not built (LLAMA_BUILD_UI=OFF: no npm) nor fetched
#: (LLAMA_USE_PREBUILT_UI=OFF: no download from the Hugging Face bucket), so
#: the server embeds an empty asset table; its HTTP API is all we use.  No
#: curl, no OpenSSL: the peers only talk to 127.0.0.1.
CMAKE_FLAGS: List[str] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
]
#: On a CPU with AMX, ``-march=native`` compiles in ggml's AMX matrix
#: product, which crashes on some machines (llama.cpp issue 20824) and is
#: what specdec-cpu's own engine turns off at run time
#: (specdec_cpu.engine.backend.use_extra_buffers): the peers are built
#: without it, so they keep the same repacked CPU buffers as ours.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return " amx_int8" in f.read()
    except OSError:
        return False


if _cpu_has_amx():
    CMAKE_FLAGS += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]

PathLike = Union[str, "os.PathLike[str]"]


class PeerBuildError(RuntimeError):
    """The peer binaries could not be obtained or built."""


class PeerRunError(RuntimeError):
    """A peer tool failed or printed output that could not be parsed."""


# ---------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------


def peers_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Directory holding the cached peer build for ``version``."""
    return cache_dir() / "peers" / f"llama.cpp-{version}"


def peer_paths(version: str = LLAMA_CPP_PYTHON_VERSION) -> Dict[str, Path]:
    """Where each peer binary lives once built (they may not exist yet)."""
    bindir = peers_dir(version) / "bin"
    return {role: bindir / name for role, name in PEER_BINARIES.items()}


def _all_present(paths: Dict[str, Path]) -> bool:
    return all(p.is_file() and os.access(p, os.X_OK) for p in paths.values())


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _run_logged(cmd: Sequence[str], log: Optional[TextIO], cwd: Optional[Path] = None) -> None:
    if log is not None:
        print("+ " + " ".join(quote(c) for c in cmd), file=log, flush=True)
    proc = subprocess.run(
        list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise PeerBuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    if log is not None and proc.stdout:
        # keep the log readable: the last lines say what was built
        for line in proc.stdout.splitlines()[-5:]:
            print("  " + line, file=log, flush=True)


def _fetch_sdist(root: Path, version: str, log: Optional[TextIO]) -> Path:
    """The llama-cpp-python sdist tarball, downloaded with pip once."""
    sdist_dir = root / "sdist"
    pattern = f"llama_cpp_python-{version}.tar.gz"
    local = os.environ.get("SPECDEC_LLAMA_CPP_SDIST")
    if local:
        p = Path(local).expanduser()
        if not p.is_file():
            raise PeerBuildError(f"SPECDEC_LLAMA_CPP_SDIST={local} is not a file")
        return p
    found = sorted(sdist_dir.glob(pattern)) if sdist_dir.is_dir() else []
    if found:
        return found[0]
    sdist_dir.mkdir(parents=True, exist_ok=True)
    _run_logged(
        # Only this package as source: ":all:" would also build its build
        # dependencies (cmake among them) from source to read its metadata.
        [sys.executable, "-m", "pip", "download", "--no-binary", "llama-cpp-python", "--no-deps",
         f"llama-cpp-python=={version}", "-d", str(sdist_dir)],
        log,
    )
    found = sorted(sdist_dir.glob(pattern)) or sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise PeerBuildError(f"pip download left no llama-cpp-python sdist in {sdist_dir}")
    return found[0]


def _extract_llama_cpp(tarball: Path, dest: Path, log: Optional[TextIO]) -> Path:
    """Extract ``vendor/llama.cpp`` of the sdist into ``dest`` (atomically)."""
    if (dest / "CMakeLists.txt").is_file():
        return dest
    if log is not None:
        print(f"extracting vendored llama.cpp from {tarball.name}", file=log, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=".src-", dir=dest.parent))
    try:
        with tarfile.open(tarball, "r:gz") as tf:
            members = []
            prefix = None
            for m in tf.getmembers():
                parts = Path(m.name).parts
                if len(parts) >= 3 and parts[1:3] == ("vendor", "llama.cpp"):
                    prefix = Path(*parts[:3])
                    if m.issym() or m.islnk() or ".." in parts or m.name.startswith("/"):
                        continue  # the tree needs no links; never follow one out
                    members.append(m)
            if prefix is None:
                raise PeerBuildError(f"{tarball} has no vendor/llama.cpp directory")
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tf.extractall(tmp, members=members, **kwargs)
        src = tmp / prefix
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(src, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_peers(
    *,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    jobs: int = 2,
    log: Optional[TextIO] = sys.stderr,
    force: bool = False,
) -> Dict[str, Path]:
    """Build (once) and return the peer binaries: ``{"plain", "speculative", "speculative-simple", "server"}``.

    Cached: when every binary already exists nothing is downloaded or built.
    Builds use at most ``jobs`` parallel compile jobs.  A lock file keeps two
    processes from building at once.
    """
    paths = peer_paths(version)
    if not force and _all_present(paths):
        return paths
    root = peers_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root.parent / f".llama.cpp-{version}.lock"):
        if not force and _all_present(paths):
            return paths
        if shutil.which("cmake") is None:
            raise PeerBuildError("building the llama.cpp peers needs cmake on PATH")
        t0 = time.monotonic()
        tarball = _fetch_sdist(root, version, log)
        src = _extract_llama_cpp(tarball, root / "src", log)
        build = root / "build"
        configure = ["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS]
        stamp = build / ".specdec-cmake-flags"
        if (build / "CMakeCache.txt").is_file():
            # configured before: keep its generator; re-run only when the flags changed
            if not stamp.is_file() or stamp.read_text() != "\n".join(CMAKE_FLAGS):
                _run_logged(configure, log)
        else:
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            _run_logged(configure, log)
        stamp.write_text("\n".join(CMAKE_FLAGS))
        targets = list(PEER_BINARIES.values())
        _run_logged(
            ["cmake", "--build", str(build), "--config", "Release", "-j", str(max(1, jobs)),
             "--target", *targets],
            log,
        )
        bindir = root / "bin"
        bindir.mkdir(exist_ok=True)
        for role, name in PEER_BINARIES.items():
            built = build / "bin" / name
            if not built.is_file():
                raise PeerBuildError(f"the build did not produce {built}")
            tmp = bindir / f".{name}.tmp"
            shutil.copy2(built, tmp)
            os.replace(tmp, paths[role])
        info = {
            "llama_cpp_python": version,
            "sdist": tarball.name,
            "cmake_flags": CMAKE_FLAGS,
            "targets": targets,
            "build_seconds": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (bindir / "BUILD-INFO.json").write_text(json.dumps(info, indent=2) + "\n")
        if log is not None:
            print(f"peers built in {info['build_seconds']} s -> {bindir}", file=log, flush=True)
    return paths


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------

#: The order our sampler applies its filters in (temperature first, then the
#: truncations; docs/kernels.md §2).  llama.cpp's default chain is different
#: (penalties, dry, top-n-sigma, top-k, typical, top-p, min-p, xtc, temperature),
#: so the peers are always given this chain explicitly.
SAMPLER_CHAIN = "temperature;top_k;top_p;min_p"


@dataclass
class PeerResult:
    """What one peer run reported about itself.

    ``tokens_per_s`` is the decode-phase throughput the tool prints (the prompt
    is excluded):

    - plain (``llama-completion``): its ``eval time`` line, i.e. single-token
      decode calls only; ``tokens_per_s_with_sampling`` also counts the time
      spent in the sampler chain, which is what a generation loop pays and what
      the speculative tools' figure includes;
    - speculative tools: their ``decoded N tokens in X seconds, speed: Y t/s``
      line (the whole draft/verify/accept loop).
    """

    tool: str
    command: List[str]
    returncode: int
    wall_seconds: float
    tokens_per_s: float
    n_decoded: int  # tokens behind tokens_per_s
    decode_seconds: float
    prompt_tokens: Optional[int] = None
    prompt_seconds: Optional[float] = None
    sampling_ms: Optional[float] = None
    tokens_per_s_with_sampling: Optional[float] = None
    n_draft_max: Optional[int] = None
    n_drafted: Optional[int] = None
    n_accepted: Optional[int] = None
    acceptance: Optional[float] = None  # n_accepted / n_drafted, as a fraction
    target_perf: Dict[str, float] = field(default_factory=dict)
    text: str = ""
    stdout: str = field(default="", repr=False)
    stderr: str = field(default="", repr=False)

    @property
    def command_line(self) -> str:
        return " ".join(quote(c) for c in self.command)

    def record(self) -> Dict[str, Any]:
        """The suite's record of the run (its command with the cache directory as ``<cache>``)."""
        return {
            "tokens": self.n_decoded,
            "tps": self.tokens_per_s,
            "decode_seconds": self.decode_seconds,
            "prompt_seconds": self.prompt_seconds,
            "prompt_tokens": self.prompt_tokens,
            "acceptance": self.acceptance,
            "drafted": self.n_drafted,
            "accepted": self.n_accepted,
            "n_draft_max": self.n_draft_max,
            "command": short_paths(self.command_line),
            "text": self.text,
        }


_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)"
_RE_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s")
_RE_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s")
_RE_KV = {
    "n_draft": re.compile(r"\bn_draft\s+=\s+(\d+)"),
    "n_predict": re.compile(r"\bn_predict\s+=\s+(\d+)"),
    "n_drafted": re.compile(r"\bn_drafted\s+=\s+(\d+)"),
    "n_accept": re.compile(r"\bn_accept\s+=\s+(\d+)"),
}
_RE_ACCEPT = re.compile(r"\baccept\s+=\s+" + _NUM + r"%")
_RE_SAMPLING = re.compile(r"perf_print:\s+sampling time =\s+" + _NUM + r" ms")
_RE_PROMPT_EVAL = re.compile(
    r"perf_print:\s+prompt eval time =\s+" + _NUM + r" ms /\s+(\d+) tokens"
)
_RE_EVAL = re.compile(
    r"perf_print:\s+eval time =\s+" + _NUM + r" ms /\s+(\d+) runs\s+\(\s*" + _NUM
    + r" ms per token,\s+" + _NUM + r" tokens per second\)"
)
_RE_LOAD = re.compile(r"perf_print:\s+load time =\s+" + _NUM + r" ms")
_RE_TOTAL = re.compile(r"perf_print:\s+total time =\s+" + _NUM + r" ms /\s+(\d+) tokens")


def _f(x: str) -> float:
    return float(x)


def _perf_section(text: str) -> Dict[str, float]:
    """The ``common_perf_print`` numbers found in ``text`` (the last of each)."""
    out: Dict[str, float] = {}
    m = _RE_SAMPLING.findall(text)
    if m:
        out["sampling_ms"] = _f(m[-1])
    m = _RE_LOAD.findall(text)
    if m:
        out["load_ms"] = _f(m[-1])
    m = _RE_PROMPT_EVAL.findall(text)
    if m:
        out["prompt_eval_ms"], out["prompt_eval_tokens"] = _f(m[-1][0]), float(m[-1][1])
    m = _RE_EVAL.findall(text)
    if m:
        ms, runs, _, tps = m[-1]
        out["eval_ms"], out["eval_runs"], out["eval_tokens_per_s"] = _f(ms), float(runs), _f(tps)
    m = _RE_TOTAL.findall(text)
    if m:
        out["total_ms"], out["total_tokens"] = _f(m[-1][0]), float(m[-1][1])
    return out


def parse_plain_output(stderr: str) -> Dict[str, float]:
    """Numbers ``llama-completion`` prints at exit (its ``common_perf_print`` block)."""
    perf = _perf_section(stderr)
    if "eval_ms" not in perf:
        raise PeerRunError("no 'eval time = ... tokens per second' line in llama-completion's output")
    return perf


def parse_speculative_output(stderr: str) -> Dict[str, float]:
    """Numbers ``llama-speculative[-simple]`` print at exit."""
    out: Dict[str, float] = {}
    m = _RE_DECODED.search(stderr)
    if not m:
        raise PeerRunError("no 'decoded N tokens in X seconds, speed: Y t/s' line in the output")
    out["decoded_tokens"], out["decode_seconds"], out["decode_tokens_per_s"] = (
        float(m.group(1)), _f(m.group(2)), _f(m.group(3)))
    m = _RE_ENCODED.search(stderr)
    if m:
        out["encoded_tokens"], out["encode_seconds"] = float(m.group(1)), _f(m.group(2))
    for key, rx in _RE_KV.items():
        m = rx.search(stderr)
        if m:
            out[key] = float(m.group(1))
    m = _RE_ACCEPT.search(stderr)
    if m:
        out["accept_percent"] = _f(m.group(1))
    # the target's perf block comes after the "target:" heading
    idx = stderr.rfind("target:")
    if idx >= 0:
        for k, v in _perf_section(stderr[idx:]).items():
            out["target_" + k] = v
    return out


def sampling_args(temp: float, top_k: int, top_p: float, min_p: float, seed: int) -> List[str]:
    return [
        "--samplers", SAMPLER_CHAIN,
        "--temp", repr(float(temp)),
        "--top-k", str(int(top_k)),
        "--top-p", repr(float(top_p)),
        "--min-p", repr(float(min_p)),
        "-s", str(int(seed)),
    ]


def _run(tool: str, cmd: List[str], timeout: Optional[float]) -> "tuple[int, str, str, float]":
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired as e:
        raise PeerRunError(f"{tool} did not finish within {timeout} s: {' '.join(cmd)}") from e
    wall = time.perf_counter() - t0
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise PeerRunError(f"{tool} exited with {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return proc.returncode, out, err, wall


def _strip_plain_text(stdout: str) -> str:
    text = stdout
    if text.endswith("\n\n"):
        text = text[:-2]
    if text.endswith(" [end of text]\n"):
        text = text[: -len(" [end of text]\n")]
    return text


def _strip_speculative_text(stdout: str, prompt: str) -> str:
    text = stdout
    if text.startswith("\n\n"):
        text = text[2:]
    if text.endswith("\n\n\n\n"):
        text = text[:-4]
    if text.startswith(prompt):
        text = text[len(prompt):]
    return text


def run_plain(
    model: PathLike,
    prompt: str,
    n_predict: int = 128,
    threads: int = 2,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 1234,
    *,
    min_p: float = 0.0,
    ctx: int = 2048,
    ignore_eos: bool = False,
    binary: Optional[PathLike] = None,
    timeout: Optional[float] = 1800.0,
) -> PeerResult:
    """Plain decoding of ``prompt`` with ``llama-completion`` (raw prompt, no chat template).

    ``top_k=0``, ``top_p=1`` and ``min_p=0`` mean off; ``temp=0`` is greedy.
    """
    exe = Path(binary) if binary is not None else ensure_peers()["plain"]
    cmd = [
        str(exe), "-m", os.fspath(model), "-p", prompt, "-n", str(int(n_predict)),
        "-t", str(int(threads)), "-tb", str(int(threads)), "-c", str(int(ctx)),
        *sampling_args(temp, top_k, top_p, min_p, seed),
        "-no-cnv", "--no-display-prompt", "--no-escape",
    ]
    if ignore_eos:
        cmd.append("--ignore-eos")
    _, out, err, wall = _run("llama-completion", cmd, timeout)
    perf = parse_plain_output(err)
    runs = int(perf["eval_runs"])
    eval_s = perf["eval_ms"] / 1e3
    with_sampling = None
    if "sampling_ms" in perf and perf["eval_ms"] + perf["sampling_ms"] > 0:
        with_sampling = runs / ((perf["eval_ms"] + perf["sampling_ms"]) / 1e3)
    return PeerResult(
        tool="plain",
        command=cmd,
        returncode=0,
        wall_seconds=wall,
        tokens_per_s=perf["eval_tokens_per_s"],
        n_decoded=runs,
        decode_seconds=eval_s,
        prompt_tokens=int(perf["prompt_eval_tokens"]) if "prompt_eval_tokens" in perf else None,
        prompt_seconds=perf["prompt_eval_ms"] / 1e3 if "prompt_eval_ms" in perf else None,
        sampling_ms=perf.get("sampling_ms"),
        tokens_per_s_with_sampling=with_sampling,
        target_perf=perf,
        text=_strip_plain_text(out),
        stdout=out,
        stderr=err,
    )


def speculative_command(target: PathLike, draft: PathLike, prompt: str, n_predict: int, threads: int, temp: float,
                        top_k: int, top_p: float, seed: int, *, min_p: float, draft_max: int, draft_min: int,
                        variant: str, ctx: int, binary: Optional[PathLike] = None) -> List[str]:
    """The command line of ``llama-speculative[-simple]`` (see :func:`run_speculative`)."""
    if variant not in ("speculative", "speculative-simple"):
        raise ValueError(f"variant must be 'speculative' or 'speculative-simple', got {variant!r}")
    exe = Path(binary) if binary is not None else ensure_peers()[variant]
    t = str(int(threads))
    cmd = [
        str(exe), "-m", os.fspath(target), "-md", os.fspath(draft), "-p", prompt,
        "-n", str(int(n_predict)), "-t", t, "-tb", t, "-td", t, "-tbd", t, "-c", str(int(ctx)),
        *sampling_args(temp, top_k, top_p, min_p, seed),
        "--no-escape",
        "--spec-draft-n-max", str(int(draft_max)), "--spec-draft-n-min", str(int(draft_min)),
    ]
    if variant == "speculative-simple":
        # this revision enables no speculative implementation unless asked to
        cmd += ["--spec-type", "draft-simple"]
    return cmd


def run_speculative(
    target: PathLike,
    draft: PathLike,
    prompt: str,
    n_predict: int = 128,
    threads: int = 2,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 1234,
    *,
    min_p: float = 0.0,
    draft_max: int = 4,
    draft_min: int = 0,
    variant: str = "speculative",
    ctx: int = 2048,
    ignore_eos: bool = False,
    binary: Optional[PathLike] = None,
    timeout: Optional[float] = 1800.0,
) -> PeerResult:
    """Speculative decoding of ``prompt`` with llama.cpp's own example tools.

    ``variant="speculative"`` runs ``llama-speculative``: the draft samples with
    the same sampler settings and the target accepts by comparing the two
    models' probabilities.  ``variant="speculative-simple"`` runs
    ``llama-speculative-simple``: the draft proposes its greedy (top-1)
    continuation and the target samples each position, keeping the draft token
    when it samples the same one.  ``draft_max`` is the number of tokens drafted
    per step (γ); both models get ``threads`` threads.
    """
    cmd = speculative_command(target, draft, prompt, n_predict, threads, temp, top_k, top_p, seed, min_p=min_p,
                              draft_max=draft_max, draft_min=draft_min, variant=variant, ctx=ctx, binary=binary)
    if ignore_eos:
        cmd.append("--ignore-eos")
    _, out, err, wall = _run(f"llama-{variant}", cmd, timeout)
    nums = parse_speculative_output(err)
    n_drafted = int(nums["n_drafted"]) if "n_drafted" in nums else None
    n_accepted = int(nums["n_accept"]) if "n_accept" in nums else None
    acceptance = (n_accepted / n_drafted) if n_drafted and n_accepted is not None else None
    return PeerResult(
        tool=variant,
        command=cmd,
        returncode=0,
        wall_seconds=wall,
        tokens_per_s=nums["decode_tokens_per_s"],
        n_decoded=int(nums["decoded_tokens"]),
        decode_seconds=nums["decode_seconds"],
        prompt_tokens=int(nums["encoded_tokens"]) if "encoded_tokens" in nums else None,
        prompt_seconds=nums.get("encode_seconds"),
        sampling_ms=nums.get("target_sampling_ms"),
        n_draft_max=int(nums["n_draft"]) if "n_draft" in nums else None,
        n_drafted=n_drafted,
        n_accepted=n_accepted,
        acceptance=acceptance,
        target_perf={k[len("target_"):]: v for k, v in nums.items() if k.startswith("target_")},
        text=_strip_speculative_text(out, prompt),
        stdout=out,
        stderr=err,
    )


# ---------------------------------------------------------------------------
# the exactness audit's adapter
# ---------------------------------------------------------------------------


class SpeculativeTool(Engine):
    """llama.cpp's ``llama-speculative`` / ``llama-speculative-simple``, one process per sequence,
    ids read from their ``-lv 5`` debug log."""

    def __init__(self, variant: str, draft_max: int = 4) -> None:
        self.variant, self.draft_max = variant, draft_max
        self.id = f"llama-{variant}"
        self.label = f"llama.cpp llama-{variant} (draft-n-max {draft_max})"
        if variant == "speculative":
            self.ids_from = ("debug log (`-lv 5`): `draft token … (ID, …) accepted` and "
                             "`the sampled target token (ID, …)` lines")
        else:
            self.ids_from = ("debug log (`-lv 5`): each round's `draft candidate 0, pos i: ID` lines and "
                             "`accepted N/M draft tokens, the last target token is: (ID)`")

    def start(self, k: int, threads: int) -> None:
        self.exe = ensure_peers()[self.variant]
        self._last_cmd: List[str] = []

    def cmd(self, job: Job, setting) -> List[str]:
        return speculative_command(
            self.ctx.target, self.ctx.draft, job.text, self.ctx.max_tokens, self.ctx.threads, setting.temperature,
            setting.top_k, setting.top_p, job.seed, min_p=setting.min_p, draft_max=self.draft_max, draft_min=0,
            variant=self.variant, ctx=N_CTX, binary=self.exe) + ["-lv", "5"]

    def run(self, jobs, setting):
        if setting.temperature <= 0:
            raise ValueError("the log parsers follow the stochastic paths (T > 0) only")
        return super().run(jobs, setting)

    def one(self, job: Job, setting) -> Sample:
        cmd = self.cmd(job, setting)
        self._last_cmd = cmd
        env = dict(os.environ)
        env.setdefault("LC_ALL", "C")
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, timeout=1800)
        if proc.returncode != 0:
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
            return Sample(job.index, job.prompt, job.text, job.seed, [], False,
                          error=f"exit {proc.returncode}: {' | '.join(tail)[:300]}")
        parse = parse_speculative_log if self.variant == "speculative" else parse_simple_log
        ids = parse(proc.stderr)
        check = printed_text_matches(proc.stdout, job, ids, self.ctx, self.variant)
        tokens, stopped = cut(ids, self.ctx.max_tokens, self.ctx.is_eog)
        try:
            nums = parse_speculative_output(proc.stderr.decode("utf-8", "replace"))
        except PeerRunError:
            nums = {}
        return Sample(job.index, job.prompt, job.text, job.seed, tokens, stopped, produced=len(ids),
                      drafted=int(nums["n_drafted"]) if "n_drafted" in nums else None,
                      accepted=int(nums["n_accept"]) if "n_accept" in nums else None, text_check=check)

    def command(self) -> str:
        cmd = list(self._last_cmd)
        if not cmd:
            return ""
        cmd[cmd.index("-p") + 1] = "<chat-templated prompt>"
        return " ".join(short_paths(quote(c)) for c in cmd)


_RE_SPEC = re.compile(
    rb"draft token \d+ of sequence \d+ \((\d+), '.*?'\) (accepted|rejected)\n"
    rb"|the sampled target token \((\d+), '", re.S)

_RE_SIMPLE = re.compile(
    rb"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \("
    rb"|accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")


def parse_speculative_log(stderr: bytes) -> List[int]:
    """The ids ``llama-speculative`` emitted (T > 0), in order, from its ``-lv 5`` log.

    examples/speculative/speculative.cpp, stochastic branch: each round emits
    the draft tokens it accepts (``draft token i of sequence s (ID, '…')
    accepted``) and ends with one token sampled from the target or the
    residual (``the sampled target token (ID, '…') did not match, or we ran
    out of drafted tokens``).  Rejected draft tokens are logged too and are
    not emitted.
    """
    ids: List[int] = []
    for m in _RE_SPEC.finditer(stderr):
        if m.group(1) is not None:
            if m.group(2) == b"accepted":
                ids.append(int(m.group(1)))
        else:
            ids.append(int(m.group(3)))
    return ids


def parse_simple_log(stderr: bytes) -> List[int]:
    """The ids ``llama-speculative-simple`` emitted, in order, from its ``-lv 5`` log.

    Each round drafts greedily (common/speculative.cpp, draft-simple: the
    top candidate at each position, logged as ``draft candidate 0, pos i:
    ID``), the target samples every position
    (``common_sampler_sample_and_accept_n``) and the round emits the first N
    draft tokens it matched and its own last sample: ``accepted N/M draft
    tokens, the last target token is: (ID)``.
    """
    ids: List[int] = []
    draft: List[int] = []
    for m in _RE_SIMPLE.finditer(stderr):
        if m.group(1) is not None:
            if int(m.group(1)) == 0:
                pos = int(m.group(2))
                if pos != len(draft):
                    raise ValueError(f"draft candidate at position {pos} after {len(draft)} drafted tokens")
                draft.append(int(m.group(3)))
        else:
            n, size, last = int(m.group(4)), int(m.group(5)), int(m.group(6))
            if n > size or (size > 0 and len(draft) < size):
                raise ValueError(f"round accepts {n}/{size} draft tokens but {len(draft)} were logged")
            ids += draft[:n] + [last]
            draft = []
    return ids


def printed_text_matches(stdout: bytes, job: Job, ids: Sequence[int], ctx: Ctx, variant: str) -> bool:
    """Whether the ids' pieces give exactly the text the tool printed.

    Both tools print "\\n\\n", the prompt's pieces, the generated pieces and
    "\\n\\n" twice.  ``llama-speculative`` prints every token it emits (an
    EOG's text and what follows it in the same round included);
    ``llama-speculative-simple`` stops printing at an EOG.
    """
    if variant == "speculative-simple":
        shown = []
        for t in ids:
            if ctx.is_eog(t):
                break
            shown.append(t)
    else:
        shown = list(ids)
    expected = b"\n\n" + ctx.render(job.ids) + ctx.render(shown) + b"\n\n\n\n"
    return stdout == expected

"""llama.cpp's own tools as benchmark peers.

The peers are built once, from the llama.cpp sources vendored in the pinned
``llama-cpp-python`` sdist (so they run the very same llama.cpp revision as our
engine), and cached under ``<cache>/peers/llama.cpp-<llama-cpp-python version>/``:

- ``plain``: ``llama-completion`` (non-interactive single-prompt generation;
  ``llama-cli`` in this revision is a chat front-end built with the server);
- ``speculative``: ``llama-speculative`` (draft model, rejection sampling
  with the draft's probabilities);
- ``speculative-simple``: ``llama-speculative-simple`` (greedy draft proposals
  checked by sampling the target and comparing);
- ``server``: ``llama-server`` (HTTP server with continuous batching over
  ``--parallel`` slots; speculative decoding with a draft model, ``-md`` with
  ``--spec-type draft-simple``, or draftless with its n-gram ``--spec-type``
  modes).  :func:`llama_server` runs one for the length of a ``with`` block,
  :func:`server_complete` sends it one ``/completion`` request (whole or
  streamed, with per-token arrival times).

Runners return the numbers each tool prints about itself (decode-only tokens/s,
drafted/accepted counts) together with the wall time and the raw output, so
the suite can compare like with like.  Nothing here asserts a time.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple, Union

from specdec_cpu.paths import cache_dir

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
        print("+ " + " ".join(_quote(c) for c in cmd), file=log, flush=True)
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


def _quote(s: str) -> str:
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


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

    def to_dict(self, raw: bool = False) -> dict:
        d = asdict(self)
        if not raw:
            d.pop("stdout")
            d.pop("stderr")
        return d

    @property
    def command_line(self) -> str:
        return " ".join(_quote(c) for c in self.command)


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


def _sampling_args(temp: float, top_k: int, top_p: float, min_p: float, seed: int) -> List[str]:
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
        *_sampling_args(temp, top_k, top_p, min_p, seed),
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
    if variant not in ("speculative", "speculative-simple"):
        raise ValueError(f"variant must be 'speculative' or 'speculative-simple', got {variant!r}")
    exe = Path(binary) if binary is not None else ensure_peers()[variant]
    t = str(int(threads))
    cmd = [
        str(exe), "-m", os.fspath(target), "-md", os.fspath(draft), "-p", prompt,
        "-n", str(int(n_predict)), "-t", t, "-tb", t, "-td", t, "-tbd", t, "-c", str(int(ctx)),
        *_sampling_args(temp, top_k, top_p, min_p, seed),
        "--no-escape",
        "--spec-draft-n-max", str(int(draft_max)), "--spec-draft-n-min", str(int(draft_min)),
    ]
    if variant == "speculative-simple":
        # this revision enables no speculative implementation unless asked to
        cmd += ["--spec-type", "draft-simple"]
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
# llama-server
# ---------------------------------------------------------------------------

#: llama-server's speculative types that need no draft model (this llama.cpp
#: revision: common/speculative.cpp).  ``ngram-simple``: the m tokens after the
#: last earlier occurrence of the current n-gram; ``ngram-map-k``: the same
#: through a map of n-grams seen min-hits times; ``ngram-map-k4v``: up to four
#: continuations per key, the clearly most frequent one drafted (experimental);
#: ``ngram-mod``: a rolling-hash pool n-gram -> next token shared by all slots,
#: drafting token by token; ``ngram-cache``: llama.cpp's lookup decoding
#: (n-gram statistics of the context, 1- to 4-grams, 8 tokens per draft).
SERVER_NGRAM_TYPES: Tuple[str, ...] = (
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")

#: The sampler order of our engine, as the list a /completion request takes.
SERVER_SAMPLERS: List[str] = SAMPLER_CHAIN.split(";")


class ServerURL(str):
    """What :func:`llama_server` yields: the base URL (``http://127.0.0.1:PORT``).

    A ``str``, so ``url + "/completion"`` works; it also carries the server's
    ``command`` (list), ``pid``, ``port``, ``startup_seconds`` and
    :meth:`log_tail` (the last lines of the server's combined stdout/stderr).
    """

    command: List[str]
    pid: int
    port: int
    startup_seconds: float
    _log: Any

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the server printed (its log goes to a temporary file)."""
        return _file_tail(self._log, lines)

    @property
    def command_line(self) -> str:
        return " ".join(_quote(c) for c in self.command)


def _file_tail(fh: Any, lines: int) -> str:
    try:
        fh.flush()
        with open(fh.name, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except (OSError, ValueError, AttributeError):
        return ""
    return "\n".join(data.strip().splitlines()[-lines:])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(
    model: PathLike,
    *,
    port: int,
    host: str = "127.0.0.1",
    draft: Optional[PathLike] = None,
    spec_type: Optional[Union[str, Sequence[str]]] = None,
    draft_max: Optional[int] = None,
    draft_min: Optional[int] = None,
    parallel: int = 1,
    ctx: int = 2048,
    threads: int = 2,
    threads_batch: Optional[int] = None,
    threads_draft: Optional[int] = None,
    threads_batch_draft: Optional[int] = None,
    kv_unified: Optional[bool] = None,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    extra_args: Sequence[str] = (),
    binary: Optional[PathLike] = None,
) -> List[str]:
    """The ``llama-server`` command line :func:`llama_server` runs (see there for the arguments)."""
    exe = Path(binary) if binary is not None else ensure_peers()["server"]
    t = int(threads)
    tb = int(threads_batch if threads_batch is not None else t)
    cmd = [
        str(exe), "-m", os.fspath(model), "--host", host, "--port", str(int(port)),
        "-c", str(int(ctx)), "--parallel", str(int(parallel)),
        "-t", str(t), "-tb", str(tb),
        *_sampling_args(temp, top_k, top_p, min_p, seed),
        "--no-webui",
    ]
    if kv_unified is True:
        cmd.append("-kvu")
    elif kv_unified is False:
        cmd.append("-no-kvu")
    types = [spec_type] if isinstance(spec_type, str) else list(spec_type or [])
    if draft is not None:
        td = int(threads_draft if threads_draft is not None else t)
        tbd = int(threads_batch_draft if threads_batch_draft is not None else td)
        cmd += ["-md", os.fspath(draft), "-td", str(td), "-tbd", str(tbd)]
        if not types:
            # this revision enables no speculative implementation unless asked to
            # (a plain GGUF draft is not auto-detected): -md alone would not speculate
            types = ["draft-simple"]
    if types:
        cmd += ["--spec-type", ",".join(types)]
    if draft_max is not None:
        cmd += ["--spec-draft-n-max", str(int(draft_max))]
    if draft_min is not None:
        cmd += ["--spec-draft-n-min", str(int(draft_min))]
    cmd += [str(a) for a in extra_args]
    return cmd


def _http(method: str, url: str, path: str, body: Optional[dict] = None,
          timeout: Optional[float] = 600.0) -> Tuple[int, bytes]:
    """One HTTP request with the standard library; returns (status, body)."""
    host_port = url.split("://", 1)[-1].rstrip("/")
    conn = http.client.HTTPConnection(host_port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@contextmanager
def llama_server(
    model: PathLike,
    *,
    draft: Optional[PathLike] = None,
    spec_type: Optional[Union[str, Sequence[str]]] = None,
    draft_max: Optional[int] = None,
    draft_min: Optional[int] = None,
    parallel: int = 1,
    ctx: int = 2048,
    threads: int = 2,
    threads_batch: Optional[int] = None,
    threads_draft: Optional[int] = None,
    threads_batch_draft: Optional[int] = None,
    kv_unified: Optional[bool] = None,
    temp: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    startup_timeout: float = 180.0,
    stop_timeout: float = 15.0,
    die_with_parent: Optional[bool] = None,
    binary: Optional[PathLike] = None,
) -> Iterator[ServerURL]:
    """Run ``llama-server`` for the length of a ``with`` block; yields its base URL.

    ::

        with llama_server(target, draft=draft, draft_max=8, parallel=4, ctx=4096) as url:
            r = server_complete(url, prompt, 128, temperature=1.0, seed=1)
            print(r.tokens_per_s, r.acceptance, url.log_tail(5))

    - ``model``: the target GGUF.  ``draft``: a draft GGUF (``-md``); with a
      draft and no ``spec_type`` the server runs ``--spec-type draft-simple``
      (the draft proposes its greedy continuation, the target samples each
      position and keeps the draft token when it samples the same one).
    - ``spec_type``: llama-server's ``--spec-type``, one name or several (see
      :data:`SERVER_NGRAM_TYPES` for the draftless ones); ``None`` with no
      draft: plain decoding.  Mode-specific knobs
      (``--spec-ngram-simple-size-n`` ...) go in ``extra_args``.
    - ``draft_max`` / ``draft_min``: ``--spec-draft-n-max`` / ``--spec-draft-n-min``
      (the draft model's γ; the n-gram modes have their own lengths).
    - ``parallel``: ``--parallel`` slots (concurrent requests); ``ctx``: ``-c``,
      the whole context shared by the slots (each slot gets ``ctx / parallel``
      unless ``kv_unified``).  ``kv_unified``: ``-kvu`` (True), ``-no-kvu``
      (False) or the server's default (None).
    - ``threads`` / ``threads_batch`` / ``threads_draft`` /
      ``threads_batch_draft``: ``-t`` / ``-tb`` / ``-td`` / ``-tbd`` (each
      defaults to ``threads``).
    - ``temp``, ``top_k``, ``top_p``, ``min_p``, ``seed``: the server's
      default sampling, with the sampler chain of our engine
      (``--samplers temperature;top_k;top_p;min_p``); requests sent with
      :func:`server_complete` set them again anyway.
    - ``startup_timeout``: seconds to wait for ``GET /health`` to return 200
      (the models are loaded).  If the server exits or the time runs out,
      :class:`PeerRunError` is raised with the tail of its log.
    - ``die_with_parent``: ask Linux to SIGTERM the server if this process
      dies without cleaning up (``PR_SET_PDEATHSIG``).  The signal follows
      the *thread* that started the server, so the default (None) enables it
      only when called from the main thread.

    On leaving the block (normally or by an exception, KeyboardInterrupt
    included) the server gets SIGTERM, then SIGKILL after ``stop_timeout``
    seconds.  The server's output goes to a temporary file, removed at the
    end; :meth:`ServerURL.log_tail` reads it while the server runs.
    A busy port (the OS gave it to someone else between our probe and the
    server's bind) is retried with another port, three times.
    """
    if die_with_parent is None:
        die_with_parent = threading.current_thread() is threading.main_thread()
    preexec = _pdeathsig_preexec() if die_with_parent else None
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    last_error: Optional[BaseException] = None
    for attempt in range(3):
        port = free_port(host)
        cmd = server_command(
            model, port=port, host=host, draft=draft, spec_type=spec_type, draft_max=draft_max,
            draft_min=draft_min, parallel=parallel, ctx=ctx, threads=threads,
            threads_batch=threads_batch, threads_draft=threads_draft,
            threads_batch_draft=threads_batch_draft, kv_unified=kv_unified, temp=temp,
            top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, extra_args=extra_args, binary=binary)
        log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, preexec_fn=preexec)
        try:
            url = ServerURL(f"http://{host}:{port}")
            url.command, url.pid, url.port, url._log = cmd, proc.pid, port, log
            try:
                _wait_healthy(url, proc, startup_timeout)
            except PeerRunError as exc:
                tail = url.log_tail(40)
                if proc.poll() is not None and re.search(r"bind|address already in use", tail, re.I):
                    last_error = exc
                    continue  # someone took the port: try another one
                raise
            url.startup_seconds = time.perf_counter() - t0
            yield url
            return
        finally:
            _stop(proc, stop_timeout)
            log.close()
            try:
                os.unlink(log.name)
            except OSError:
                pass
    raise PeerRunError(f"llama-server could not bind a free port: {last_error}")


def _pdeathsig_preexec():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def preexec() -> None:  # runs in the child between fork and exec
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    return preexec


def _wait_healthy(url: ServerURL, proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        rc = proc.poll()
        if rc is not None:
            raise PeerRunError(f"llama-server exited with {rc} while starting: {url.command_line}\n"
                               f"{url.log_tail(30)}")
        try:
            status, _ = _http("GET", url, "/health", timeout=5.0)
            if status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise PeerRunError(f"llama-server did not report healthy within {timeout:.0f} s: "
                               f"{url.command_line}\n{url.log_tail(30)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _stop(proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


@dataclass
class ServerCompletion:
    """One ``/completion`` answer of llama-server, as :func:`server_complete` returns it.

    Rates are the server's own decode-phase figures (``timings`` of the
    response): ``tokens_per_s`` = ``predicted_per_second`` = (``n_predicted``
    − 1) / ``predicted_ms`` — the first token comes from the prompt pass and
    the clock starts when the prompt is done, so prompt processing is
    excluded, as in the other tools' decode figures.
    """

    text: str
    token_ids: List[int]  # the generated tokens (an end-of-generation token included if one ended it)
    n_predicted: int  # timings.predicted_n
    predicted_ms: float  # timings.predicted_ms
    tokens_per_s: float  # timings.predicted_per_second
    prompt_tokens: Optional[int]  # tokens_evaluated (the whole prompt)
    prompt_processed: Optional[int]  # timings.prompt_n (not taken from the slot's cache)
    prompt_ms: Optional[float]  # timings.prompt_ms
    cache_n: Optional[int]  # timings.cache_n (prompt tokens reused from the slot's cache)
    draft_n: Optional[int]  # timings.draft_n: tokens drafted (absent when nothing was drafted)
    draft_n_accepted: Optional[int]  # timings.draft_n_accepted
    stop_type: Optional[str]  # "eos", "limit", "word" or "none"
    truncated: bool
    wall_seconds: float  # request sent -> last byte received, as the client saw it
    id_slot: Optional[int] = None
    #: streaming only: the text each event carried (one per token; "" while a
    #: UTF-8 character is incomplete) and when it arrived, in seconds after
    #: the request was sent.
    pieces: Optional[List[str]] = None
    arrival_s: Optional[List[float]] = None
    timings: Dict[str, Any] = field(default_factory=dict)
    request: Dict[str, Any] = field(default_factory=dict, repr=False)
    response: Dict[str, Any] = field(default_factory=dict, repr=False)  # the final JSON object

    @property
    def acceptance(self) -> Optional[float]:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        if not self.draft_n:
            return None
        return (self.draft_n_accepted or 0) / self.draft_n

    @property
    def ttft_s(self) -> Optional[float]:
        """Time to first token (streaming): request sent -> first token event received."""
        return self.arrival_s[0] if self.arrival_s else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("response")
        d["acceptance"] = self.acceptance
        d["ttft_s"] = self.ttft_s
        return d


def completion_request(
    prompt: Union[str, Sequence[int]],
    n_predict: int = 128,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    stream: bool = False,
    cache_prompt: bool = True,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The JSON body :func:`server_complete` posts to ``/completion``.

    The prompt goes in raw (a string is tokenized by the server with special
    tokens parsed, like the other tools' ``-p``; a list of ids is used as is).
    Sampling matches ours: the chain ``temperature, top_k, top_p, min_p``
    (``samplers``), with every other sampler of llama.cpp left out of the
    chain; ``top_k=0``, ``top_p=1``, ``min_p=0`` are off, ``temperature=0``
    is greedy.  ``return_tokens`` makes the answer carry the token ids.
    ``extra`` adds or overrides fields (``ignore_eos``, ``stop``,
    ``n_probs``, ``timings_per_token`` ...).
    """
    body: Dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        "n_predict": int(n_predict),
        "temperature": float(temperature),
        "top_k": int(top_k),
        "top_p": float(top_p),
        "min_p": float(min_p),
        "seed": int(seed),
        "samplers": list(SERVER_SAMPLERS),
        "stream": bool(stream),
        "return_tokens": True,
        "cache_prompt": bool(cache_prompt),
    }
    if extra:
        body.update(extra)
    return body


def server_complete(
    url: str,
    prompt: Union[str, Sequence[int]],
    n_predict: int = 128,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 1234,
    stream: bool = False,
    cache_prompt: bool = True,
    extra: Optional[Dict[str, Any]] = None,
    timeout: Optional[float] = 600.0,
    endpoint: str = "/completion",
) -> ServerCompletion:
    """Send one ``/completion`` request to a llama-server at ``url`` and wait for the answer.

    Arguments are those of :func:`completion_request`; ``endpoint="/infill"``
    sends a fill-in-the-middle request (its ``input_prefix``,
    ``input_suffix`` and ``input_extra`` in ``extra``, the prompt empty).  ``stream=True`` reads
    the server-sent events as they come and records, for every token, its
    text piece and its arrival time (``pieces``, ``arrival_s``; ``ttft_s``
    is the first), for time-to-first-token and inter-token measurements; the
    final event carries the same ``timings`` as a whole answer.  Blocking and
    thread-safe (one HTTP connection per call, standard library only), so
    concurrent clients can each call it from their own thread.

    Raises :class:`PeerRunError` on an HTTP error status, an error event or a
    response without ``timings``.
    """
    body = completion_request(prompt, n_predict, temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, seed=seed, stream=stream, cache_prompt=cache_prompt,
                              extra=extra)
    host_port = url.split("://", 1)[-1].rstrip("/")
    conn = http.client.HTTPConnection(host_port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", endpoint, body=json.dumps(body).encode("utf-8"),
                     headers={"Content-Type": "application/json",
                              "Accept": "text/event-stream" if stream else "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise PeerRunError(f"llama-server {endpoint} answered {resp.status}: "
                               f"{resp.read()[:500].decode('utf-8', 'replace')}")
        if not stream:
            final = json.loads(resp.read())
            wall = time.perf_counter() - t0
            ids = [int(t) for t in final.get("tokens") or []]
            return _completion(final, body, wall, ids, None, None)
        ids: List[int] = []
        pieces: List[str] = []
        arrival: List[float] = []
        final = None
        for event in _sse_events(resp):
            now = time.perf_counter() - t0
            if "error" in event:
                raise PeerRunError(f"llama-server streamed an error: {event['error']}")
            toks = event.get("tokens") or []
            for i, tok in enumerate(toks):
                ids.append(int(tok))
                pieces.append(event.get("content", "") if i == 0 else "")
                arrival.append(now)
            if event.get("stop"):
                final = event
        wall = time.perf_counter() - t0
        if final is None:
            raise PeerRunError("llama-server's stream ended without a final (stop) event")
        return _completion(final, body, wall, ids, pieces, arrival)
    except (OSError, http.client.HTTPException) as exc:
        raise PeerRunError(f"llama-server request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def _sse_events(resp: "http.client.HTTPResponse") -> Iterator[Dict[str, Any]]:
    """The JSON objects of a server-sent event stream (``data: {...}`` lines),
    each yielded as soon as its line has arrived."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line or line.startswith(b":"):
            continue  # event separator or a ping comment
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            yield json.loads(payload)
        elif line.startswith(b"error:"):
            yield {"error": line[6:].strip().decode("utf-8", "replace")}


def _completion(final: Dict[str, Any], body: Dict[str, Any], wall: float, ids: List[int],
                pieces: Optional[List[str]], arrival: Optional[List[float]]) -> ServerCompletion:
    tm = final.get("timings")
    if not tm:
        raise PeerRunError("llama-server's answer has no 'timings'")
    text = final.get("content", "") if pieces is None else "".join(pieces) + final.get("content", "")
    return ServerCompletion(
        text=text,
        token_ids=ids,
        n_predicted=int(tm.get("predicted_n", final.get("tokens_predicted", 0))),
        predicted_ms=float(tm.get("predicted_ms", 0.0)),
        tokens_per_s=float(tm.get("predicted_per_second", 0.0)),
        prompt_tokens=final.get("tokens_evaluated"),
        prompt_processed=tm.get("prompt_n"),
        prompt_ms=tm.get("prompt_ms"),
        cache_n=tm.get("cache_n"),
        draft_n=tm.get("draft_n"),
        draft_n_accepted=tm.get("draft_n_accepted"),
        stop_type=final.get("stop_type"),
        truncated=bool(final.get("truncated", False)),
        wall_seconds=wall,
        id_slot=final.get("id_slot"),
        pieces=pieces,
        arrival_s=arrival,
        timings=dict(tm),
        request=body,
        response={k: v for k, v in final.items() if k != "generation_settings"},
    )


def server_tokenize(url: str, text: str, *, add_special: bool = True, timeout: float = 60.0) -> List[int]:
    """``POST /tokenize``: the server's token ids for ``text`` (special tokens parsed)."""
    status, data = _http("POST", url, "/tokenize",
                         {"content": text, "add_special": add_special, "parse_special": True},
                         timeout=timeout)
    if status != 200:
        raise PeerRunError(f"llama-server /tokenize answered {status}")
    return [int(t) if not isinstance(t, dict) else int(t["id"]) for t in json.loads(data)["tokens"]]


def server_detokenize(url: str, ids: Sequence[int], *, timeout: float = 60.0) -> str:
    """``POST /detokenize``: the text of ``ids``."""
    status, data = _http("POST", url, "/detokenize", {"tokens": [int(t) for t in ids]}, timeout=timeout)
    if status != 200:
        raise PeerRunError(f"llama-server /detokenize answered {status}")
    return json.loads(data)["content"]


def server_props(url: str, *, timeout: float = 30.0) -> Dict[str, Any]:
    """``GET /props``: the server's settings (default generation settings, slots, model)."""
    status, data = _http("GET", url, "/props", timeout=timeout)
    if status != 200:
        raise PeerRunError(f"llama-server /props answered {status}")
    return json.loads(data)


def run_server(url: str, prompt: str, n_predict: int = 128, temp: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 1234, *, min_p: float = 0.0,
               timeout: Optional[float] = 1800.0) -> PeerResult:
    """One single-client request to a running llama-server, as a :class:`PeerResult`
    (the suite's record of a peer run; the argument names match :func:`run_plain`)."""
    r = server_complete(url, prompt, n_predict, temperature=temp, top_k=top_k, top_p=top_p,
                        min_p=min_p, seed=seed, timeout=timeout)
    cmd = list(getattr(url, "command", []) or [])
    return PeerResult(
        tool="server",
        command=cmd,
        returncode=0,
        wall_seconds=r.wall_seconds,
        tokens_per_s=r.tokens_per_s,
        n_decoded=r.n_predicted,
        decode_seconds=r.predicted_ms / 1e3,
        prompt_tokens=r.prompt_tokens,
        prompt_seconds=None if r.prompt_ms is None else r.prompt_ms / 1e3,
        n_drafted=r.draft_n if r.draft_n is not None else 0,
        n_accepted=r.draft_n_accepted if r.draft_n is not None else 0,
        acceptance=r.acceptance,
        target_perf=dict(r.timings),
        text=r.text,
    )


def _demo(n_predict: int = 32) -> None:  # pragma: no cover - manual check
    """Run every peer once on the default pair and print the parsed numbers."""
    from specdec_cpu.demo_models import ensure_default_pair

    target, draft = ensure_default_pair(progress=None)
    prompt = "def fibonacci(n):"
    runs = [
        run_plain(target, prompt, n_predict, temp=0.0),
        run_speculative(target, draft, prompt, n_predict, temp=0.0, variant="speculative"),
        run_speculative(target, draft, prompt, n_predict, temp=0.0, variant="speculative-simple"),
    ]
    for r in runs:
        print(r.command_line)
        print(json.dumps(r.to_dict(), indent=2, default=str))
    _server_demo(n_predict)


def _server_demo(n_predict: int = 32) -> None:  # pragma: no cover - manual check
    """llama-server with the default pair's draft (-md): one whole and one streamed
    request (per-token arrival times), printed."""
    from specdec_cpu.demo_models import ensure_default_pair

    target, draft = ensure_default_pair(progress=None)
    prompt = "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"
    with llama_server(target, draft=draft, draft_max=8, ctx=1024) as url:
        print(url.command_line, f"(ready in {url.startup_seconds:.1f} s)")
        for stream in (False, True):
            r = server_complete(url, prompt, n_predict, temperature=1.0, seed=1, stream=stream)
            print(f"stream={stream}: {r.n_predicted} tokens, {r.tokens_per_s:.1f} tok/s (server timings), "
                  f"drafted {r.draft_n}, accepted {r.draft_n_accepted}, stop {r.stop_type}, "
                  f"wall {r.wall_seconds:.2f} s" + (f", ttft {r.ttft_s * 1e3:.0f} ms" if stream else ""))
            if stream:
                print("  arrivals (ms):", " ".join(f"{t * 1e3:.0f}" for t in r.arrival_s))
            print("  ids:", r.token_ids[:16], "...")
            print("  text:", repr(r.text[:120]))


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] == ["demo"]:
        _demo(int(sys.argv[2]) if len(sys.argv) > 2 else 32)
    elif sys.argv[1:2] == ["server-demo"]:
        _server_demo(int(sys.argv[2]) if len(sys.argv) > 2 else 32)
    else:
        for role, path in ensure_peers().items():
            print(f"{role:20s} {path}")

"""llama.cpp's command-line tools as engines, and the build of every llama.cpp binary.

The binaries are built once from the llama.cpp vendored in the pinned llama-cpp-python sdist (the
revision our engine runs) into ``<cache>/peers/llama.cpp-<version>/``.  :func:`run_plain` and
:func:`run_speculative` return what each tool prints about itself (:class:`PeerResult`);
:class:`SpeculativeTool` is the audit's adapter, reading the sampled ids from the tools' debug log.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Union

from specdec_cpu.paths import cache_dir

from ..common import quote
from .base import N_CTX, Ctx, Engine, Job, Sample, cut, shown, tool_env

#: The llama-cpp-python release whose vendored llama.cpp the peers are built from.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

#: Peer role -> CMake target / binary name (``llama-cli`` is a chat front-end in this revision).
PEER_BINARIES: Dict[str, str] = {
    "plain": "llama-completion",
    "speculative": "llama-speculative",
    "speculative-simple": "llama-speculative-simple",
    "server": "llama-server",
}

#: The peer build: no web UI (no npm, no download), no curl/OpenSSL (the peers only talk to 127.0.0.1).
CMAKE_FLAGS: List[str] = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_APP=OFF",
]
#: ggml's AMX path crashes on some CPUs (llama.cpp issue 20824) and ours turns it off: so do the peers.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as _f:
    if " amx_int8" in _f.read():
        CMAKE_FLAGS += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]

PathLike = Union[str, "os.PathLike[str]"]


class PeerBuildError(RuntimeError):
    """The peer binaries could not be obtained or built."""


class PeerRunError(RuntimeError):
    """A peer tool failed or printed output that could not be parsed."""


# building -------------------------------------------------------------------


def _run_logged(cmd: Sequence[str], log: Optional[TextIO]) -> None:
    if log is not None:
        print("+ " + " ".join(quote(c) for c in cmd), file=log, flush=True)
    proc = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise PeerBuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    if log is not None:
        for line in proc.stdout.splitlines()[-5:]:
            print("  " + line, file=log, flush=True)


def _fetch_sdist(root: Path, version: str, log: Optional[TextIO]) -> Path:
    """The llama-cpp-python sdist (``SPECDEC_LLAMA_CPP_SDIST``, or downloaded with pip once)."""
    local = os.environ.get("SPECDEC_LLAMA_CPP_SDIST")
    if local:
        if not Path(local).expanduser().is_file():
            raise PeerBuildError(f"SPECDEC_LLAMA_CPP_SDIST={local} is not a file")
        return Path(local).expanduser()
    sdist_dir, pattern = root / "sdist", f"llama_cpp_python-{version}.tar.gz"
    found = sorted(sdist_dir.glob(pattern)) if sdist_dir.is_dir() else []
    if not found:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        # --no-binary for this package only: ":all:" would build its build dependencies from source too
        _run_logged([sys.executable, "-m", "pip", "download", "--no-binary", "llama-cpp-python", "--no-deps",
                     f"llama-cpp-python=={version}", "-d", str(sdist_dir)], log)
        found = sorted(sdist_dir.glob(pattern)) or sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise PeerBuildError(f"pip download left no llama-cpp-python sdist in {sdist_dir}")
    return found[0]


def _extract_llama_cpp(tarball: Path, dest: Path, log: Optional[TextIO]) -> Path:
    """Extract the sdist's ``vendor/llama.cpp`` into ``dest`` (atomically, no links)."""
    if (dest / "CMakeLists.txt").is_file():
        return dest
    if log is not None:
        print(f"extracting vendored llama.cpp from {tarball.name}", file=log, flush=True)
    with (tempfile.TemporaryDirectory(prefix=".src-", dir=dest.parent, ignore_cleanup_errors=True) as tmp,
          tarfile.open(tarball, "r:gz") as tf):
        members, prefix = [], None
        for m in tf.getmembers():
            parts = Path(m.name).parts
            if len(parts) >= 3 and parts[1:3] == ("vendor", "llama.cpp"):
                prefix = Path(*parts[:3])
                if not (m.issym() or m.islnk() or ".." in parts or m.name.startswith("/")):
                    members.append(m)
        if prefix is None:
            raise PeerBuildError(f"{tarball} has no vendor/llama.cpp directory")
        tf.extractall(tmp, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(Path(tmp) / prefix, dest)
    return dest


def ensure_peers(*, log: Optional[TextIO] = sys.stderr) -> Dict[str, Path]:
    """Build (once, two compile jobs, under a lock) and return the peer binaries by role."""
    version = LLAMA_CPP_PYTHON_VERSION
    root = cache_dir() / "peers" / f"llama.cpp-{version}"
    paths = {role: root / "bin" / name for role, name in PEER_BINARIES.items()}

    def present() -> bool:
        return all(p.is_file() and os.access(p, os.X_OK) for p in paths.values())

    if present():
        return paths
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".llama.cpp-{version}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if present():
            return paths
        if shutil.which("cmake") is None:
            raise PeerBuildError("building the llama.cpp peers needs cmake on PATH")
        t0 = time.monotonic()
        tarball = _fetch_sdist(root, version, log)
        src = _extract_llama_cpp(tarball, root / "src", log)
        build, bindir = root / "build", root / "bin"
        configure = ["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS]
        stamp = build / ".specdec-cmake-flags"
        if not (build / "CMakeCache.txt").is_file():
            _run_logged(configure + (["-G", "Ninja"] if shutil.which("ninja") else []), log)
        elif not stamp.is_file() or stamp.read_text() != "\n".join(CMAKE_FLAGS):
            _run_logged(configure, log)  # configured before: keep its generator
        stamp.write_text("\n".join(CMAKE_FLAGS))
        targets = list(PEER_BINARIES.values())
        _run_logged(["cmake", "--build", str(build), "--config", "Release", "-j", "2", "--target", *targets], log)
        bindir.mkdir(exist_ok=True)
        for role, name in PEER_BINARIES.items():
            if not (build / "bin" / name).is_file():
                raise PeerBuildError(f"the build did not produce {build / 'bin' / name}")
            shutil.copy2(build / "bin" / name, bindir / f".{name}.tmp")
            os.replace(bindir / f".{name}.tmp", paths[role])
        info = {"llama_cpp_python": version, "sdist": tarball.name, "cmake_flags": CMAKE_FLAGS, "targets": targets,
                "build_seconds": round(time.monotonic() - t0, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (bindir / "BUILD-INFO.json").write_text(json.dumps(info, indent=2) + "\n")
        if log is not None:
            print(f"peers built in {info['build_seconds']} s -> {bindir}", file=log, flush=True)
    return paths


# running ----------------------------------------------------------------------

#: Our sampler's order (docs/kernels.md §2), given explicitly: llama.cpp's default chain differs.
SAMPLER_CHAIN = "temperature;top_k;top_p;min_p"


@dataclass
class PeerResult:
    """What one peer run reported about itself.

    ``tokens_per_s``: the tool's decode-phase rate (llama-completion: its ``eval time``,
    sampling excluded, see ``tokens_per_s_with_sampling``; the speculative tools: their
    ``decoded N tokens ... t/s``, the whole loop).
    """

    command: List[str]
    wall_seconds: float
    tokens_per_s: float
    n_decoded: int  # tokens behind tokens_per_s
    decode_seconds: float
    prompt_tokens: Optional[int] = None
    prompt_seconds: Optional[float] = None
    tokens_per_s_with_sampling: Optional[float] = None
    n_draft_max: Optional[int] = None
    n_drafted: Optional[int] = None
    n_accepted: Optional[int] = None
    acceptance: Optional[float] = None  # n_accepted / n_drafted
    target_perf: Dict[str, float] = field(default_factory=dict)
    text: str = ""

    def record(self) -> Dict[str, Any]:
        """The suite's record of the run."""
        return {"tokens": self.n_decoded, "tps": self.tokens_per_s, "decode_seconds": self.decode_seconds,
                "prompt_seconds": self.prompt_seconds, "prompt_tokens": self.prompt_tokens,
                "acceptance": self.acceptance, "drafted": self.n_drafted, "accepted": self.n_accepted,
                "n_draft_max": self.n_draft_max, "command": shown(self.command), "text": self.text}


_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)"
#: ``common_perf_print`` lines: keys of the numbers each gives.
_PERF = [
    (re.compile(r"perf_print:\s+sampling time =\s+" + _NUM + r" ms"), ("sampling_ms",)),
    (re.compile(r"perf_print:\s+prompt eval time =\s+" + _NUM + r" ms /\s+(\d+) tokens"),
     ("prompt_eval_ms", "prompt_eval_tokens")),
    (re.compile(r"perf_print:\s+eval time =\s+" + _NUM + r" ms /\s+(\d+) runs\s+\(\s*" + _NUM
                + r" ms per token,\s+" + _NUM + r" tokens per second\)"),
     ("eval_ms", "eval_runs", None, "eval_tokens_per_s")),
    (re.compile(r"perf_print:\s+total time =\s+" + _NUM + r" ms /\s+(\d+) tokens"), ("total_ms", "total_tokens")),
]
#: The speculative tools' summary lines.
_SPEC = [
    (re.compile(r"decoded\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s"),
     ("decoded_tokens", "decode_seconds", "decode_tokens_per_s")),
    (re.compile(r"encoded\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s"),
     ("encoded_tokens", "encode_seconds", None)),
    *((re.compile(rf"\b{k}\s+=\s+(\d+)"), (k,)) for k in ("n_draft", "n_drafted", "n_accept")),
]


def _numbers(text: str, patterns: list, last: bool) -> Dict[str, float]:
    """The numbers of each pattern's last (else first) match in ``text``, by key."""
    out: Dict[str, float] = {}
    for rx, keys in patterns:
        found = rx.findall(text) if last else [m.groups() for m in [rx.search(text)] if m]
        if found:
            groups = found[-1] if isinstance(found[-1], tuple) else (found[-1],)
            out.update((k, float(v)) for k, v in zip(keys, groups) if k)
    return out


def _int(nums: Dict[str, float], key: str) -> Optional[int]:
    return int(nums[key]) if key in nums else None


def parse_speculative_output(stderr: str) -> Dict[str, float]:
    """Numbers ``llama-speculative[-simple]`` print at exit."""
    out = _numbers(stderr, _SPEC, last=False)
    if "decoded_tokens" not in out:
        raise PeerRunError("no 'decoded N tokens in X seconds, speed: Y t/s' line in the output")
    return out


def sampling_args(temp: float, top_k: int, top_p: float, min_p: float, seed: int) -> List[str]:
    return ["--samplers", SAMPLER_CHAIN, "--temp", repr(float(temp)), "--top-k", str(int(top_k)),
            "--top-p", repr(float(top_p)), "--min-p", repr(float(min_p)), "-s", str(int(seed))]


def _run(tool: str, cmd: List[str], timeout: Optional[float]) -> "tuple[str, str, float]":
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=tool_env())
    except subprocess.TimeoutExpired as e:
        raise PeerRunError(f"{tool} did not finish within {timeout} s: {' '.join(cmd)}") from e
    wall = time.perf_counter() - t0
    out, err = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise PeerRunError(f"{tool} exited with {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return out, err, wall


def run_plain(model: PathLike, prompt: str, n_predict: int = 128, threads: int = 2, temp: float = 0.0,
              top_k: int = 0, top_p: float = 1.0, seed: int = 1234, *, min_p: float = 0.0, ctx: int = 2048,
              ignore_eos: bool = False, timeout: Optional[float] = 1800.0) -> PeerResult:
    """Plain decoding with ``llama-completion`` (raw prompt; top_k 0, top_p 1, min_p 0 are off, temp 0 greedy)."""
    t = str(int(threads))
    cmd = [str(ensure_peers()["plain"]), "-m", os.fspath(model), "-p", prompt, "-n", str(int(n_predict)),
           "-t", t, "-tb", t, "-c", str(int(ctx)), *sampling_args(temp, top_k, top_p, min_p, seed),
           "-no-cnv", "--no-display-prompt", "--no-escape"] + (["--ignore-eos"] if ignore_eos else [])
    out, err, wall = _run("llama-completion", cmd, timeout)
    perf = _numbers(err, _PERF, last=True)
    if "eval_ms" not in perf:
        raise PeerRunError("no 'eval time = ... tokens per second' line in llama-completion's output")
    runs, eval_ms, sampling_ms = int(perf["eval_runs"]), perf["eval_ms"], perf.get("sampling_ms")
    with_sampling = runs / ((eval_ms + sampling_ms) / 1e3) if sampling_ms is not None and eval_ms + sampling_ms > 0 \
        else None
    return PeerResult(
        cmd, wall, perf["eval_tokens_per_s"], runs, eval_ms / 1e3, prompt_tokens=_int(perf, "prompt_eval_tokens"),
        prompt_seconds=perf["prompt_eval_ms"] / 1e3 if "prompt_eval_ms" in perf else None,
        tokens_per_s_with_sampling=with_sampling, target_perf=perf,
        text=out.removesuffix("\n\n").removesuffix(" [end of text]\n"))


def speculative_command(target: PathLike, draft: PathLike, prompt: str, n_predict: int, threads: int, temp: float,
                        top_k: int, top_p: float, seed: int, *, min_p: float, draft_max: int, variant: str,
                        ctx: int) -> List[str]:
    """The command line of ``llama-speculative[-simple]`` (``variant``: "speculative" or "speculative-simple")."""
    t = str(int(threads))
    cmd = [str(ensure_peers()[variant]), "-m", os.fspath(target), "-md", os.fspath(draft), "-p", prompt,
           "-n", str(int(n_predict)), "-t", t, "-tb", t, "-td", t, "-tbd", t, "-c", str(int(ctx)),
           *sampling_args(temp, top_k, top_p, min_p, seed), "--no-escape",
           "--spec-draft-n-max", str(int(draft_max)), "--spec-draft-n-min", "0"]
    # this revision enables no speculative implementation unless asked to
    return cmd + (["--spec-type", "draft-simple"] if variant == "speculative-simple" else [])


def run_speculative(target: PathLike, draft: PathLike, prompt: str, n_predict: int = 128, threads: int = 2,
                    temp: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 1234, *, min_p: float = 0.0,
                    draft_max: int = 4, variant: str = "speculative", ctx: int = 2048, ignore_eos: bool = False,
                    timeout: Optional[float] = 1800.0) -> PeerResult:
    """Speculative decoding with ``llama-speculative`` (the draft samples, acceptance by the two
    models' probabilities) or ``llama-speculative-simple`` (greedy draft, the target keeps what it
    samples the same); ``draft_max`` tokens drafted per step."""
    cmd = speculative_command(target, draft, prompt, n_predict, threads, temp, top_k, top_p, seed, min_p=min_p,
                              draft_max=draft_max, variant=variant, ctx=ctx)
    cmd += ["--ignore-eos"] if ignore_eos else []
    out, err, wall = _run(f"llama-{variant}", cmd, timeout)
    nums = parse_speculative_output(err)
    n_drafted, n_accepted = _int(nums, "n_drafted"), _int(nums, "n_accept")
    return PeerResult(
        cmd, wall, nums["decode_tokens_per_s"], int(nums["decoded_tokens"]), nums["decode_seconds"],
        prompt_tokens=_int(nums, "encoded_tokens"), prompt_seconds=nums.get("encode_seconds"),
        n_draft_max=_int(nums, "n_draft"), n_drafted=n_drafted, n_accepted=n_accepted,
        acceptance=(n_accepted / n_drafted) if n_drafted and n_accepted is not None else None,
        text=out.removeprefix("\n\n").removesuffix("\n\n\n\n").removeprefix(prompt))


# the exactness audit's adapter ----------------------------------------------------


class SpeculativeTool(Engine):
    """Audit: ``llama-speculative[-simple]``, one process per sequence, ids read from the ``-lv 5`` log."""

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
        ensure_peers()
        self._last_cmd: List[str] = []

    def run(self, jobs, setting):
        if setting.temperature <= 0:
            raise ValueError("the log parsers follow the stochastic paths (T > 0) only")
        return super().run(jobs, setting)

    def one(self, job: Job, setting) -> Sample:
        c = self.ctx
        cmd = speculative_command(
            c.target, c.draft, job.text, c.max_tokens, c.threads, setting.temperature, setting.top_k, setting.top_p,
            job.seed, min_p=setting.min_p, draft_max=self.draft_max, variant=self.variant, ctx=N_CTX) + ["-lv", "5"]
        self._last_cmd = cmd
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=tool_env(), timeout=1800)
        if proc.returncode != 0:
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
            return Sample(job.index, job.prompt, job.text, job.seed, [], False,
                          error=f"exit {proc.returncode}: {' | '.join(tail)[:300]}")
        ids = (parse_speculative_log if self.variant == "speculative" else parse_simple_log)(proc.stderr)
        tokens, stopped = cut(ids, c.max_tokens, c.is_eog)
        try:
            nums = parse_speculative_output(proc.stderr.decode("utf-8", "replace"))
            drafted, accepted = _int(nums, "n_drafted"), _int(nums, "n_accept")
        except PeerRunError:
            drafted = accepted = None
        return Sample(job.index, job.prompt, job.text, job.seed, tokens, stopped, produced=len(ids), drafted=drafted,
                      accepted=accepted, text_check=printed_text_matches(proc.stdout, job, ids, c, self.variant))

    def command(self) -> str:
        return shown(self._last_cmd, {"-p": "<chat-templated prompt>"}) if self._last_cmd else ""


_RE_SPEC = re.compile(
    rb"draft token \d+ of sequence \d+ \((\d+), '.*?'\) (accepted|rejected)\n"
    rb"|the sampled target token \((\d+), '", re.S)
_RE_SIMPLE = re.compile(
    rb"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \("
    rb"|accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")


def parse_speculative_log(stderr: bytes) -> List[int]:
    """The ids ``llama-speculative`` emitted (T > 0): each round's accepted draft tokens, then
    its one token sampled from the target or the residual (examples/speculative/speculative.cpp)."""
    ids: List[int] = []
    for m in _RE_SPEC.finditer(stderr):
        if m.group(1) is None:
            ids.append(int(m.group(3)))
        elif m.group(2) == b"accepted":
            ids.append(int(m.group(1)))
    return ids


def parse_simple_log(stderr: bytes) -> List[int]:
    """The ids ``llama-speculative-simple`` emitted: each round's greedy draft (``draft candidate
    0, pos i: ID``), of which ``accepted N/M ... (ID)`` keeps N, then the target's own sample."""
    ids: List[int] = []
    draft: List[int] = []
    for m in _RE_SIMPLE.finditer(stderr):
        if m.group(1) is not None:
            if int(m.group(1)) == 0:
                if int(m.group(2)) != len(draft):
                    raise ValueError(f"draft candidate at position {m.group(2).decode()} after {len(draft)} "
                                     "drafted tokens")
                draft.append(int(m.group(3)))
        else:
            n, size, last = int(m.group(4)), int(m.group(5)), int(m.group(6))
            if n > size or (size > 0 and len(draft) < size):
                raise ValueError(f"round accepts {n}/{size} draft tokens but {len(draft)} were logged")
            ids += draft[:n] + [last]
            draft = []
    return ids


def printed_text_matches(stdout: bytes, job: Job, ids: Sequence[int], ctx: Ctx, variant: str) -> bool:
    """Whether the ids' pieces give exactly what the tool printed ("\\n\\n", prompt, generated
    pieces, "\\n\\n\\n\\n"); ``llama-speculative-simple`` stops printing at an EOG."""
    shown_ids = list(ids)
    if variant == "speculative-simple":
        shown_ids = next((shown_ids[:i] for i, t in enumerate(ids) if ctx.is_eog(t)), shown_ids)
    return stdout == b"\n\n" + ctx.render(job.ids) + ctx.render(shown_ids) + b"\n\n\n\n"

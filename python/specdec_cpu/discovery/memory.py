"""Will the models fit?  Checked before loading, instead of being killed while loading.

The need is the model files (all parts; llama.cpp maps them and reads every
weight), their KV caches at the context size asked for (F16 K and V for every
layer, from the GGUF metadata) and an allowance for llama.cpp's compute
buffers.  The memory available is the kernel's ``MemAvailable``
(``/proc/meminfo``: free memory plus what the page cache can give back),
else free pages (``os.sysconf``), and no more than a cgroup's limit allows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import InsufficientMemoryError, ModelLoadError
from .shards import other_parts
from .store import describe
from .units import format_bytes

__all__ = ["available_memory", "MemoryNeed", "memory_need", "check_memory", "COMPUTE_ALLOWANCE"]

#: Bytes set aside for llama.cpp's compute buffers and the process itself.
COMPUTE_ALLOWANCE = 200_000_000


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> Optional[int]:
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit_text = Path(limit_file).read_text().strip()
            if limit_text == "max":
                return None
            limit, usage = int(limit_text), int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # cgroup v1's "no limit"
            return None
        return max(limit - usage, 0)
    return None


def available_memory() -> Optional[Tuple[int, str]]:
    """``(bytes, where the figure comes from)``, or None when it cannot be told."""
    found: Optional[Tuple[int, str]] = None
    avail = _meminfo_available()
    if avail is not None:
        found = (avail, "MemAvailable")
    else:
        try:
            pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            if pages > 0 and size > 0:
                found = (pages * size, "free memory")
        except (ValueError, OSError, AttributeError):
            pass
    room = _cgroup_room()
    if room is not None and (found is None or room < found[0]):
        found = (room, "the cgroup's memory limit")
    return found


@dataclass(frozen=True)
class MemoryNeed:
    """What loading needs: ``(label, bytes)`` of each file, the KV caches' bytes."""

    files: List[Tuple[str, int]]
    kv: int
    tokens: int

    @property
    def total(self) -> int:
        return sum(n for _, n in self.files) + self.kv + COMPUTE_ALLOWANCE


def _kv(path: Path, tokens: int) -> int:
    try:
        per_token = describe(path, other_parts(path)).meta.kv_bytes_per_token
    except ModelLoadError:  # not readable here: the loader will say why
        return 0
    return (per_token or 0) * tokens


def memory_need(models: List[Tuple[str, Path]], *, n_ctx: int, n_seq: int = 1) -> MemoryNeed:
    """The memory ``models`` (``(label, path)``) need with ``n_seq`` sequences of ``n_ctx`` tokens."""
    files, kv, tokens = [], 0, n_ctx * n_seq
    for label, path in models:
        try:
            size = sum(os.stat(p).st_size for p in (path, *other_parts(path)))
        except OSError:
            size = 0
        files.append((label, size))
        kv += _kv(path, tokens)
    return MemoryNeed(files, kv, tokens)


def check_memory(models: List[Tuple[str, Path]], *, n_ctx: int, n_seq: int = 1) -> Optional[MemoryNeed]:
    """Raise InsufficientMemoryError, naming the sizes, when ``models`` would not
    fit in the memory available now; returns the need (None when the available
    memory cannot be told: nothing is checked)."""
    avail = available_memory()
    if avail is None:
        return None
    need = memory_need(models, n_ctx=n_ctx, n_seq=n_seq)
    if need.total > avail[0]:
        parts = " + ".join(f"{label} {format_bytes(n)}" for label, n in need.files)
        raise InsufficientMemoryError(
            f"not enough memory: {parts} + KV cache ~{format_bytes(need.kv)} ({need.tokens} tokens) "
            f"+ ~{format_bytes(COMPUTE_ALLOWANCE)} for buffers = {format_bytes(need.total)}, but "
            f"{format_bytes(avail[0])} is available ({avail[1]}); close other programs, choose a "
            "smaller quantisation or context (--ctx), or skip this check with --no-memory-check")
    return need

"""llama.cpp's OpenMP worker threads: give them back when a thread stops decoding.

llama.cpp built with OpenMP (its default on Linux, and llama-cpp-python's)
runs each pass as a parallel region of the thread that calls
``llama_decode``.  GNU libgomp keeps a pool of worker threads for every
thread that ever opened a region, for as long as that thread lives.  Once
the process holds more of these threads than it has CPUs, libgomp stops
spinning at barriers for *every* pool and puts waiting threads to sleep
instead, and a pass crosses a barrier after each of its hundreds of
operations.  So a second thread that once ran a pass (a calibration on the
main thread, an idle decoder's scheduler, a request thread of a pool)
slows every later pass of the process: on 2 cores, 2 threads, F32 target,
one such thread cost plain decoding 17% and speculative decoding 10%, and
several (the serving benchmark's process) cost plain decoding 30%
(docs/architecture.md §4; bench/HISTORY.md, "OpenMP workers").

:func:`release_threads` frees the calling thread's pool; its next pass
makes a new one (a fraction of a millisecond).  It is a no-op without
libgomp (llama.cpp built without OpenMP, or with another runtime).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Optional

__all__ = ["release_threads"]

_lock = threading.Lock()
_pause: Optional[Callable[[int], int]] = None
_looked_up = False
_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: soft pause, the runtime may resume on the next region


def _libgomp_pause() -> Optional[Callable[[int], int]]:
    """``omp_pause_resource_all`` of the libgomp this process has loaded, if any."""
    global _pause, _looked_up
    with _lock:
        if _looked_up:
            return _pause
        _looked_up = True
        try:
            with open("/proc/self/maps", encoding="utf-8") as f:
                paths = {line.split()[-1] for line in f if "libgomp" in line}
        except OSError:  # not Linux: no libgomp to ask
            return None
        for path in sorted(paths):
            try:
                fn = ctypes.CDLL(path).omp_pause_resource_all  # already loaded: the same library
            except (OSError, AttributeError):  # an older libgomp without OpenMP 5.0's pause
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            _pause = fn
            break
        return _pause


def release_threads() -> bool:
    """Free the calling thread's OpenMP worker threads (libgomp only).

    Call it from a thread that has run llama.cpp passes and will not run one
    for a while, never from inside a pass.  Returns whether a pool was
    released (False: no libgomp, or it declined).
    """
    pause = _libgomp_pause()
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0

"""One-time llama.cpp backend initialisation and log routing.

llama.cpp prints several hundred lines while loading a model.  They are
silenced by default; set ``SPECDEC_LLAMA_LOG=1`` to see them on stderr.  In
both cases the most recent error and warning lines are remembered so that
load failures can say *why* llama.cpp refused a file.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import sys
import threading
from typing import Deque, List

import llama_cpp.llama_cpp as lib

__all__ = ["lib", "ensure_backend", "recent_log_errors", "clear_log_errors", "describe_failure", "LOG_ENV",
           "AMX_ENV", "use_extra_buffers"]

LOG_ENV = "SPECDEC_LLAMA_LOG"
#: Set to 1 to let a llama.cpp built with AMX put weights in its AMX buffers.
AMX_ENV = "SPECDEC_LLAMA_AMX"

_GGML_LOG_WARN = 3
_GGML_LOG_ERROR = 4
_GGML_LOG_CONT = 5

_init_lock = threading.Lock()
_initialised = False

_recent_lock = threading.Lock()
_recent: Deque[str] = collections.deque(maxlen=16)
_last_level = 0


def _log_verbose() -> bool:
    return os.environ.get(LOG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _on_log(level: int, text: bytes, user_data: object) -> None:  # runs on llama.cpp's threads
    global _last_level
    try:
        if level == _GGML_LOG_CONT:
            level = _last_level
        else:
            _last_level = level
        if level in (_GGML_LOG_WARN, _GGML_LOG_ERROR) and text:
            line = text.decode("utf-8", "replace").strip()
            if line:
                with _recent_lock:
                    _recent.append(line)
        if _verbose and text:
            sys.stderr.write(text.decode("utf-8", "replace"))
            sys.stderr.flush()
    except Exception:  # never let an exception cross into C
        pass


_verbose = _log_verbose()
# Kept alive for the life of the process: llama.cpp stores the raw pointer.
_LOG_CALLBACK = lib.llama_log_callback(_on_log)


def ensure_backend() -> None:
    """Initialise llama.cpp once per process (thread-safe, idempotent)."""
    global _initialised, _verbose
    if _initialised:
        return
    with _init_lock:
        if _initialised:
            return
        _verbose = _log_verbose()
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        lib.llama_backend_init()
        _initialised = True


def clear_log_errors() -> None:
    """Forget the remembered llama.cpp warnings/errors (call before an operation)."""
    with _recent_lock:
        _recent.clear()


def recent_log_errors() -> List[str]:
    """llama.cpp's most recent warning and error lines, oldest first."""
    with _recent_lock:
        return list(_recent)


def describe_failure(default: str) -> str:
    """A short reason for a failed llama.cpp call, from its error lines."""
    lines = recent_log_errors()
    errors = [ln for ln in lines if "error" in ln.lower()] or [ln for ln in lines if "fail" in ln.lower()]
    picked = errors or lines
    if not picked:
        return default
    # "llama_model_load: error loading model: X" -> "error loading model: X"
    reason = _FUNC_PREFIX.sub("", picked[0])
    return reason or default


_FUNC_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_:]*: ")


def use_extra_buffers() -> bool:
    """Whether models may load into llama.cpp's extra CPU buffer types
    (weights repacked for a faster matrix product).

    Not when this llama.cpp was built with AMX (``-march=native`` on a CPU
    that has it, the default for a source build): its AMX matrix product
    crashes the process on some machines (llama.cpp issue 20824, open and
    machine-dependent; seen here on a Q4_0 model's first multi-token pass),
    and llama.cpp picks AMX first for every type it handles.  Without the
    extra buffers the weights stay in plain CPU buffers, computed by the
    same AVX-512 kernels, slower for quantised weights (no repacking).  Build
    llama-cpp-python with ``CFLAGS``/``CXXFLAGS`` ``-mno-amx-tile
    -mno-amx-int8 -mno-amx-bf16`` to keep the repacked buffers, or set
    ``SPECDEC_LLAMA_AMX=1`` where AMX is known to work.
    """
    if os.environ.get(AMX_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return not _amx_in_build()


def _amx_in_build() -> bool:
    info = lib.llama_print_system_info()
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info or "")
    return re.search(r"\bAMX_INT8\s*=\s*1\b", text) is not None

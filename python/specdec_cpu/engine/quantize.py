"""Write a GGUF model at another precision with llama.cpp's quantizer."""

from __future__ import annotations

import ctypes
import os
from typing import Optional, Union

from ..errors import ModelLoadError
from ..paths import atomic_path
from .backend import clear_log_errors, describe_failure, ensure_backend, lib
from .gguf_meta import check_gguf_file

__all__ = ["quantize", "FTYPES"]

# llama_ftype values of the precisions this project uses.
FTYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q4_K_M": 15,
    "BF16": 32,
}


def quantize(src: Union[str, "os.PathLike[str]"], dst: Union[str, "os.PathLike[str]"],
             ftype: int, n_threads: Optional[int] = None) -> str:
    """Write ``src`` re-encoded as ``ftype`` (a llama_ftype, see FTYPES) to ``dst``.

    Already-quantised inputs are allowed (requantisation).  The output is
    written to a temporary file next to ``dst`` and renamed into place, so
    ``dst`` is either the complete result or untouched.  Returns ``dst``.
    Errors raise ModelLoadError naming the file.
    """
    if isinstance(ftype, str):
        if ftype.upper() not in FTYPES:
            raise ValueError(f"unknown ftype {ftype!r}; known: {', '.join(FTYPES)}")
        ftype = FTYPES[ftype.upper()]
    if isinstance(ftype, bool) or not isinstance(ftype, int):
        raise TypeError(f"ftype must be an int (llama_ftype) or a name, got {ftype!r}")
    if ftype < 0:
        raise ValueError(f"ftype must be >= 0, got {ftype}")
    if n_threads is None:
        n_threads = os.cpu_count() or 1
    if isinstance(n_threads, bool) or not isinstance(n_threads, int):
        raise TypeError(f"n_threads must be an int, got {n_threads!r}")
    if n_threads <= 0:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    src_s = check_gguf_file(src)
    dst_s = os.fspath(dst)
    out_dir = os.path.dirname(os.path.abspath(dst_s))
    if not os.path.isdir(out_dir):
        raise ModelLoadError(f"output directory does not exist: {out_dir}")
    if os.path.isdir(dst_s):
        raise ModelLoadError(f"output path is a directory: {dst_s}")
    ensure_backend()

    with atomic_path(dst_s, suffix=".gguf.tmp") as tmp:
        params = lib.llama_model_quantize_default_params()
        params.nthread = n_threads
        params.ftype = ftype
        params.allow_requantize = True
        clear_log_errors()
        rc = int(lib.llama_model_quantize(src_s.encode("utf-8"), tmp.encode("utf-8"), ctypes.byref(params)))
        if rc != 0:
            reason = describe_failure("llama.cpp's quantizer failed")
            raise ModelLoadError(f"failed to quantize {src_s} to ftype {ftype} ({dst_s}): {reason}")
        if os.path.getsize(tmp) == 0:
            raise ModelLoadError(f"quantizing {src_s} produced an empty file")
    return dst_s

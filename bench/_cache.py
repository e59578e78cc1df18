"""Where the benchmark suite keeps what it builds and derives.

The same rule as the package's model cache (``specdec_cpu.models.cache_dir``):
``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec-cpu``, else
``~/.cache/specdec-cpu``.  Kept importable without the compiled package so that
peer binaries can be built on a machine where specdec-cpu is not installed yet.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The root of the specdec-cpu cache (not created here)."""
    try:
        from specdec_cpu.models import cache_dir as _package_cache_dir
    except ImportError:
        pass
    else:
        return _package_cache_dir()
    explicit = os.environ.get("SPECDEC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "specdec-cpu"
    return Path.home() / ".cache" / "specdec-cpu"

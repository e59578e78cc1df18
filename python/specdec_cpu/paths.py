"""Where specdec-cpu keeps files, and how it writes them safely."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union


def cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec-cpu``, else ``~/.cache/specdec-cpu``."""
    explicit = os.environ.get("SPECDEC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "specdec-cpu"
    return Path.home() / ".cache" / "specdec-cpu"


@contextmanager
def atomic_path(dst: Union[str, os.PathLike], suffix: str = ".tmp") -> Iterator[str]:
    """A hidden temporary path beside ``dst``, moved onto ``dst`` when the block
    succeeds and removed when it fails, so ``dst`` is never seen half-written."""
    dst = Path(dst)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=suffix, dir=dst.parent)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise type(exc)(exc.errno, exc.strerror, str(dst)) from None
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

"""Where the benchmark suite keeps what it builds and derives: the package's cache."""

from specdec_cpu.paths import cache_dir

__all__ = ["cache_dir"]

"""Sizes as people read them: parameters (``7.6B``) and bytes (``4.7 GB``)."""

from __future__ import annotations

from typing import Optional

__all__ = ["format_params", "format_bytes"]


def format_params(n: Optional[int]) -> str:
    """``7615616512`` -> ``"7.6B"``, ``494032768`` -> ``"494M"``."""
    if n is None:
        return "?"
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if n < 10 * scale and unit == "B" else f"{n / scale:.0f}{unit}"
    return str(n)


def format_bytes(n: Optional[float]) -> str:
    """Decimal units: ``4683073184`` -> ``"4.7 GB"``."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"  # pragma: no cover

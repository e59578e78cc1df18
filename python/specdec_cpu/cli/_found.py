"""The models found on this machine, as ``specdec-cpu models`` shows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from ..discovery import Catalog, ModelEntry, ModelInfo, describe, discover
from ..discovery.store import is_cached
from ..discovery.units import format_bytes, format_params
from ..errors import ModelLoadError

__all__ = ["FoundModels"]

_HEADERS = ("NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "VOCAB", "CHAT")


@dataclass
class FoundModels:
    """Usable models with their metadata, and what could not be used (and why)."""

    catalog: Catalog
    rows: List[Tuple[ModelEntry, ModelInfo]] = field(default_factory=list)
    unusable: List[Tuple[ModelEntry, str]] = field(default_factory=list)

    @classmethod
    def collect(cls, model_dirs: Sequence[str] = (),
                say: Optional[Callable[[str], None]] = None) -> "FoundModels":
        """Discover (the demo pair aside: it has its own table) and read each model's metadata."""
        catalog = discover(model_dirs, demo=False)
        out = cls(catalog)
        usable = catalog.usable()
        fresh = [e for e in usable if not is_cached(e.path, e.extra_parts)]
        if say is not None and sum(e.size() or 0 for e in fresh) > 256_000_000:
            say(f"reading the metadata of {len(fresh)} model files (once: it is cached) ...")
        for e in catalog.entries:
            if e.problem is not None:
                out.unusable.append((e, e.problem))
                continue
            try:
                out.rows.append((e, describe(e.path, e.extra_parts)))
            except ModelLoadError as exc:
                out.unusable.append((e, str(exc)))
        return out

    def to_json(self) -> dict:
        return {
            "found": [{"name": e.name, "source": e.source, "aliases": list(e.aliases),
                       "parts": [str(p) for p in e.parts], **info.to_dict()} for e, info in self.rows],
            "unusable": [{"name": e.name, "source": e.source, "path": str(e.path), "problem": why}
                         for e, why in self.unusable],
            "searched": [{"source": s, "path": str(p), "exists": exists}
                         for s, p, exists in self.catalog.searched],
        }

    def text_lines(self) -> List[str]:
        lines: List[str] = []
        if self.rows:
            table = [_HEADERS] + [_row(e, info) for e, info in self.rows]
            widths = [max(len(r[i]) for r in table) for i in range(len(_HEADERS))]
            lines.append(f"Models found on this machine ({len(self.rows)}):")
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
        else:
            lines.append("No other GGUF models found on this machine.")
        if self.unusable:
            lines += ["", "Found but not usable:"]
            lines += [f"  {e.qualified}: {why}" for e, why in self.unusable]
        lines += ["", f"Searched: {self.catalog.where()}."]
        if self.rows:
            example = next((e for e, info in self.rows if info.meta.chat_template), self.rows[0][0])
            lines.append("Use a name wherever a model file is accepted, e.g. "
                         f"`specdec-cpu chat --target {example.name}`.")
        return lines


def _row(e: ModelEntry, info: ModelInfo) -> Tuple[str, ...]:
    m = info.meta
    vocab = f"{m.n_vocab} {m.vocab_type}" if m.n_vocab else "-"
    return (e.name, e.source, m.architecture or "?", format_params(m.n_params), m.file_type or "?",
            format_bytes(info.size), vocab, "yes" if m.chat_template else "no")

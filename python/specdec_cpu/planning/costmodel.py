"""Measured costs of one (target, draft) pair on one machine, and their cache.

A :class:`CostModel` holds T_target(k) for k = 1..K rows, T_draft(1) and the
measured acceptance α; from them the planner derives c, v(k) and the best γ.
Calibrations are cached on disk under a key that changes whenever a model
file, the thread count or the CPU changes, so a second start is instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from ..paths import atomic_path, cache_dir
from . import theory

__all__ = [
    "CostModel",
    "ModelIdentity",
    "cache_dir",
    "calibration_key",
    "calibration_path",
    "cpu_model",
]

FORMAT_VERSION = 1
#: How the timings are taken (part of the cache key: a calibration taken the
#: old way is measured again).  2: draft passes beyond DRAFT_LOGIT_ROWS rows
#: return only their last row's logits (calibration.py).
TIMING_METHOD = 2


@dataclass(frozen=True)
class ModelIdentity:
    """Which model file a calibration was measured with (path, size, mtime)."""

    path: str
    size: int
    mtime: float

    @classmethod
    def of(cls, path: Union[str, os.PathLike]) -> "ModelIdentity":
        """Identity of the file at ``path`` (absolute path, size, mtime)."""
        p = Path(path).resolve()
        st = p.stat()
        return cls(str(p), int(st.st_size), float(st.st_mtime))


@dataclass
class CostModel:
    """Measured step costs of a (target, draft) pair on one machine.

    Attributes:
        target_ms: T_target(k) in milliseconds for k = 1..K rows (index k − 1).
        draft_ms: T_draft(1) in milliseconds (0 for a free drafter).
        draft_batch_ms: T_draft(b) for b = 1..B rows (index b − 1), the draft
            pass of a batch drafting for b requests at once; None if not measured.
        alpha: measured mean acceptance Σ min(p, q), or None if unknown.
        n_threads: threads the models ran with.
        cpu: the CPU model string.
        target, draft: identities of the model files (None when unknown).
        sampling: the sampling settings α was measured at.
        created: ISO-8601 UTC time of the measurement.
    """

    target_ms: list[float]
    draft_ms: float
    alpha: Optional[float] = None
    draft_batch_ms: Optional[list[float]] = None
    n_threads: int = 0
    cpu: str = ""
    target: Optional[ModelIdentity] = None
    draft: Optional[ModelIdentity] = None
    sampling: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def __post_init__(self) -> None:
        t = np.asarray(self.target_ms, dtype=float)
        if t.ndim != 1 or t.size == 0:
            raise ValueError("target_ms must be a non-empty list of T_target(k) for k = 1..K")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise ValueError(f"target_ms must be positive and finite, got {t.tolist()}")
        if not (np.isfinite(self.draft_ms) and self.draft_ms >= 0):
            raise ValueError(f"draft_ms must be >= 0 and finite, got {self.draft_ms}")
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1] or None, got {self.alpha}")
        self.target_ms = [float(x) for x in t]
        self.draft_ms = float(self.draft_ms)
        if self.draft_batch_ms is not None:
            d = np.asarray(self.draft_batch_ms, dtype=float)
            if d.ndim != 1 or d.size == 0 or not np.all(np.isfinite(d)) or np.any(d <= 0):
                raise ValueError(f"draft_batch_ms must be a non-empty list of positive times, got {d.tolist()}")
            self.draft_batch_ms = [float(x) for x in d]

    # ------------------------------------------------------------ derived costs
    @property
    def cost(self) -> float:
        """c = T_draft(1) / T_target(1)."""
        return self.draft_ms / self.target_ms[0]

    @property
    def k_max(self) -> int:
        """The largest measured row count K."""
        return len(self.target_ms)

    def target_time(self, k: int) -> float:
        """T_target(k) in ms; beyond the measured K, continued linearly.

        The extrapolation slope is the least-squares slope over all measured
        points (robust to one noisy row; measured curves are not monotone),
        clamped at 0 because a pass over more rows never costs less.
        """
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k (rows in a target pass) must be an int >= 1, got {k!r}")
        k = int(k)
        if k <= self.k_max:
            return self.target_ms[k - 1]
        return self.target_ms[-1] + self._slope() * (k - self.k_max)

    def verify_cost(self, k: int) -> float:
        """v(k) = T_target(k) / T_target(1)."""
        return self.target_time(k) / self.target_ms[0]

    def verify_curve(self, k_max: int) -> np.ndarray:
        """v as an array indexed by k (v[0] = nan, v[1] = 1) up to ``k_max``."""
        v = np.full(k_max + 1, np.nan)
        v[1:] = [self.verify_cost(k) for k in range(1, k_max + 1)]
        return v

    def speedup(self, gamma: int, alpha: Optional[float] = None) -> float:
        """Predicted speed-up at draft length ``gamma`` (α defaults to the measured one)."""
        return float(theory.speedup(self._alpha(alpha), gamma, self.cost, self.verify_curve(int(gamma) + 1)))

    def optimal_gamma(self, gamma_max: int = 12, alpha: Optional[float] = None) -> int:
        """The best γ in 0..gamma_max for these costs (0: plain decoding)."""
        return theory.optimal_gamma(self._alpha(alpha), self.cost, gamma_max, self.verify_curve(gamma_max + 1))

    def plan(self, gamma_max: int = 12, alpha: Optional[float] = None) -> list[theory.PlanRow]:
        """The plan table for these costs."""
        return theory.plan_table(self._alpha(alpha), self.cost, gamma_max, self.verify_curve(gamma_max + 1))

    def _alpha(self, alpha: Optional[float]) -> float:
        a = self.alpha if alpha is None else alpha
        if a is None:
            raise ValueError("alpha is unknown: this cost model has no measured alpha, pass alpha=")
        return a

    def _slope(self) -> float:
        if self.k_max < 2:
            return 0.0  # one point: no evidence of a slope; flat is the only neutral choice
        k = np.arange(1, self.k_max + 1, dtype=float)
        slope = np.polyfit(k, np.asarray(self.target_ms), 1)[0]
        return max(float(slope), 0.0)

    # ------------------------------------------------------------ identity
    @property
    def key(self) -> str:
        """The cache key of this calibration (models, threads, CPU)."""
        return calibration_key(self.target, self.draft, self.n_threads, self.cpu)

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (with a format version)."""
        data = asdict(self)
        data["format"] = FORMAT_VERSION
        return data

    def to_json(self) -> str:
        """The cost model as a JSON string."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        """Inverse of :meth:`to_dict`; raises ValueError on malformed data."""
        if not isinstance(data, Mapping):
            raise ValueError("a cost model must be a JSON object")
        fmt = data.get("format", FORMAT_VERSION)
        if fmt != FORMAT_VERSION:
            raise ValueError(f"unsupported cost model format {fmt!r} (expected {FORMAT_VERSION})")
        missing = [k for k in ("target_ms", "draft_ms") if k not in data]
        if missing:
            raise ValueError(f"cost model lacks {', '.join(missing)}")
        try:
            return cls(
                target_ms=list(data["target_ms"]),
                draft_ms=float(data["draft_ms"]),
                alpha=None if data.get("alpha") is None else float(data["alpha"]),
                draft_batch_ms=None if data.get("draft_batch_ms") is None else list(data["draft_batch_ms"]),
                n_threads=int(data.get("n_threads", 0)),
                cpu=str(data.get("cpu", "")),
                target=_identity(data.get("target")),
                draft=_identity(data.get("draft")),
                sampling=dict(data.get("sampling") or {}),
                created=str(data.get("created", "")),
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed cost model: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "CostModel":
        """Parse :meth:`to_json` output; raises ValueError on malformed input."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: Union[str, os.PathLike]) -> Path:
        """Write atomically (temp file + rename), so readers never see half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.to_json())
                f.write("\n")
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "CostModel":
        """Read a saved cost model; ValueError names the file when it is malformed."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def _identity(data: Any) -> Optional[ModelIdentity]:
    if data is None:
        return None
    return ModelIdentity(str(data["path"]), int(data["size"]), float(data["mtime"]))


# ---------------------------------------------------------------- cache location



def calibration_path(key: str) -> Path:
    """Where the calibration with cache key ``key`` lives:
    ``$SPECDEC_CALIBRATION_DIR``, else ``calibration/`` in the cache directory."""
    explicit = os.environ.get("SPECDEC_CALIBRATION_DIR")
    folder = Path(explicit).expanduser() if explicit else cache_dir() / "calibration"
    return folder / f"{key}.json"


def calibration_key(target: Optional[ModelIdentity], draft: Optional[ModelIdentity],
                    n_threads: int, cpu: str) -> str:
    """A short hash of everything the timings depend on.

    Model files are identified by path, size and mtime: replacing or
    re-quantising a file changes the key.  Sampling settings are not part of
    the key because they change α but not the timings (α is re-measured when
    they differ).  How the timings are taken (``TIMING_METHOD``) is: a
    calibration taken an older way is measured again.
    """
    parts: Sequence[Any] = (
        None if target is None else [target.path, target.size, target.mtime],
        None if draft is None else [draft.path, draft.size, draft.mtime],
        int(n_threads),
        cpu,
        TIMING_METHOD,
    )
    digest = hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()
    return digest[:24]


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux, else the platform module)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                # x86 says "model name"; some ARM kernels only "Hardware"/"CPU part".
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"

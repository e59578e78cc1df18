"""Type stubs of the C++ extension (csrc/bindings.cpp).

Arrays are never converted: float32 arguments must already be float32,
C-contiguous and aligned (TypeError naming the argument otherwise). Every
kernel call releases the GIL. Bad logits (NaN, +inf, a row that is all -inf)
raise ``specdec_cpu.errors.InvalidLogitsError`` (a ValueError) naming the row
and the token.
"""

from typing import Optional

import numpy as np
import numpy.typing as npt

#: Per-row changes to the logits before the sampling chain (csrc/kernels/adjust.h):
#: ``mask`` is (rows, ceil(V/32)) uint32 (or (ceil(V/32),) for one row), bit t%32
#: of word t//32 set where token t is allowed; ``sparse`` is (offsets (rows+1,)
#: int64, ids int32, scale_pos, scale_neg, add float32): for the ids of row r,
#: ``offsets[r]:offsets[r+1]``, a logit x becomes (x * scale_pos if x > 0 else
#: x * scale_neg) + add.
Mask = Optional[npt.NDArray[np.uint32]]
Sparse = Optional[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.float32],
                        npt.NDArray[np.float32], npt.NDArray[np.float32]]]

def active_isa() -> str:
    """The instruction set the kernels run on: 'scalar', 'avx2', 'avx512' or 'neon'."""

def supported_isas() -> list[str]:
    """Instruction sets this CPU (and this build) can run, slowest first; 'scalar' always."""

def set_isa(name: str) -> None:
    """Force a kernel path; ValueError if unknown or unsupported here."""

class Rng:
    """Counter-based generator (Philox-4x32-10): draw n of (seed, stream) is a pure
    function of the three, so a (seed, stream) pair reproduces its sequence and
    different streams never share draws. Not thread-safe."""

    def __init__(self, seed: int, stream: int = 0) -> None:
        """seed and stream in [0, 2**64) (ValueError otherwise)."""
    def uniform(self) -> float:
        """Next uniform double in [0, 1) with 53 random bits."""
    @property
    def seed(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def counter(self) -> int:
        """Number of draws made so far."""

def distribution(
    logits: npt.NDArray[np.float32], temperature: float, top_k: int, top_p: float, min_p: float,
    mask: Mask = None, sparse: Sparse = None,
) -> npt.NDArray[np.float32]:
    """Final sampling distribution of logits (V,) or (n, V): temperature -> top-k
    -> top-p -> min-p -> normalise; a new float32 array of the same shape."""

def sample(
    logits: npt.NDArray[np.float32], temperature: float, top_k: int, top_p: float, min_p: float, rng: Rng,
    mask: Mask = None, sparse: Sparse = None,
) -> int:
    """One token drawn from the distribution of logits (V,) (one uniform)."""

def sample_into(
    logits: npt.NDArray[np.float32],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rng: Rng,
    out: npt.NDArray[np.float32],
    mask: Mask = None,
    sparse: Sparse = None,
) -> int:
    """Write the distribution of logits (V_in,) to out[:V_in], zeros to
    out[V_in:] (out is (V_out,) with V_out >= V_in), and draw a token from it."""

def acceptance_rate(p: npt.NDArray[np.float32], q: npt.NDArray[np.float32]) -> float:
    """Σ min(p, q) of two float32 rows (V,): float32 sums of 64-entry blocks, added in double."""

def verify(
    target_logits: npt.NDArray[np.float32],
    draft_tokens: npt.NDArray[np.int32],
    draft_probs: Optional[npt.NDArray[np.float32]],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rng: Rng,
    mask: Mask = None,
    sparse: Sparse = None,
) -> tuple[int, int, npt.NDArray[np.float64]]:
    """Speculative verification of one step.

    target_logits is (γ+1, V); draft_tokens (γ,) int32 (or int64); draft_probs
    (γ, V) or None for a one-hot q. Returns (n_accepted, token, alphas) where
    alphas holds Σ min(p, q) of every verified row.
    """

def verify_ptr(
    address: int,
    n_rows: int,
    n_vocab: int,
    draft_tokens: npt.NDArray[np.int32],
    draft_probs: Optional[npt.NDArray[np.float32]],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rng: Rng,
    mask: Mask = None,
    sparse: Sparse = None,
) -> tuple[int, int, npt.NDArray[np.float64]]:
    """verify() over n_rows x n_vocab contiguous float32 logits at a raw address."""

def logprobs(
    logits: npt.NDArray[np.float32],
    tokens: npt.NDArray[np.int64] | npt.NDArray[np.int32],
    top_n: int,
    sampling: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    mask: Mask = None,
    sparse: Sparse = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """Log-probabilities of tokens (k,) under rows (k, V): of the model's own
    distribution (log softmax at T = 1; sampling=False) or of the sampling
    distribution (each row adjusted by mask and sparse, then the chain;
    sampling=True). Returns (token_logprobs (k,), top_ids (k, top_n),
    top_logprobs (k, top_n))."""

def _exp(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Elementwise exp of the active kernel path (flattened); for accuracy tests."""

"""What one generation produced (:class:`Generation`), what it did and where
its time went (:class:`GenerationStats`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

__all__ = ["Generation", "GenerationStats"]


@dataclass
class GenerationStats:
    """Counters and timings of one ``generate``/``stream`` call.

    ``queue_seconds`` is the time a request of a batched decoder waited for
    a free sequence (not part of ``total_seconds``); ``first_token_seconds``
    (batched decoder) is the time from its submission to its first token,
    queue and prompt included: its time to first token inside the decoder.
    ``forced`` counts tokens a grammar forced: drafted for free and always
    accepted, they are not in ``drafted``/``accepted`` nor in the α rows.
    ``acceptance`` is accepted/drafted (what the drafts achieved);
    ``mean_alpha`` is the mean of the exact Σ min(p, q) over every verified
    row (what they could be expected to achieve: the quantity the planner uses).
    """

    prompt_tokens: int = 0
    prompt_cached: int = 0
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    forced: int = 0
    alpha_sum: float = 0.0
    alpha_rows: int = 0
    queue_seconds: float = 0.0
    prompt_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    sampling_seconds: float = 0.0
    total_seconds: float = 0.0
    first_token_seconds: float = 0.0
    finish_reason: Optional[str] = None
    gammas: list[int] = field(default_factory=list)
    by_drafter: dict[str, list[int]] = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_alpha(self) -> float:
        """Mean exact acceptance probability Σ min(p, q) of the verified rows."""
        return self.alpha_sum / self.alpha_rows if self.alpha_rows else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Emitted tokens per target pass (1.0 for plain decoding)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def decode_seconds(self) -> float:
        """Time spent generating, after the prompt was processed."""
        return max(self.total_seconds - self.prompt_seconds, 0.0)

    @property
    def overhead_seconds(self) -> float:
        """Decode time not spent in the draft, the target or a sampling kernel."""
        spent = self.draft_seconds + self.target_seconds + self.sampling_seconds
        return max(self.decode_seconds - spent, 0.0)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decode time (prompt excluded)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def mean_gamma(self) -> float:
        """Average draft length over the steps (0 for plain decoding)."""
        return sum(self.gammas) / len(self.gammas) if self.gammas else 0.0

    def record_drafter(self, name: str, drafted: int, accepted: int) -> None:
        """Split drafted/accepted counts by drafter (model, n-gram)."""
        counts = self.by_drafter.setdefault(name, [0, 0])
        counts[0] += drafted
        counts[1] += accepted

    def gamma_runs(self) -> list[tuple[int, int]]:
        """The γ chosen over time as (γ, number of consecutive steps) runs."""
        runs: list[tuple[int, int]] = []
        for g in self.gammas:
            if runs and runs[-1][0] == g:
                runs[-1] = (g, runs[-1][1] + 1)
            else:
                runs.append((g, 1))
        return runs

    def to_dict(self) -> dict[str, Any]:
        """Plain data, derived rates included (for JSON output)."""
        data = asdict(self)
        del data["gammas"]
        data["gamma_runs"] = self.gamma_runs()
        for name in ("acceptance", "mean_alpha", "tokens_per_step", "decode_seconds",
                     "overhead_seconds", "tokens_per_second", "mean_gamma"):
            data[name] = getattr(self, name)
        return data

    def summary(self) -> str:
        """One human line: speed, acceptance, α, γ."""
        return (f"{self.tokens} tokens, {self.tokens_per_second:.1f} tok/s, "
                f"{self.tokens_per_step:.2f} tok/step, acceptance {self.acceptance:.2f}, "
                f"mean α {self.mean_alpha:.3f}, mean γ {self.mean_gamma:.1f}")


@dataclass
class Generation:
    """The result of one generation: its text, token ids and statistics;
    ``logprobs`` (one ``core.logprobs.TokenLogprob`` per token) when asked for;
    ``prompt_logprobs`` (one per prompt token after the first, which nothing
    predicts: the model's own distribution) when asked for; ``end_logprob``:
    with ``logprobs``, the entry of the end-of-generation or stop token that
    ended the output (not one of ``tokens``), if one did."""

    text: str
    tokens: list[int]
    stats: GenerationStats = field(repr=False)
    logprobs: Optional[list] = field(default=None, repr=False)
    prompt_logprobs: Optional[list] = field(default=None, repr=False)
    end_logprob: Any = field(default=None, repr=False)

    @property
    def finish_reason(self) -> Optional[str]:
        """``stop`` (EOG or a stop string), ``length``, ``context``, ``cancelled`` or ``timeout``."""
        return self.stats.finish_reason

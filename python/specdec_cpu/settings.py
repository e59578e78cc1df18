"""The decoders' settings, each declared once: its default, its check and its
help text feed the Python API, the command line and the environment alike.

``DecoderSettings`` holds what both decoders take (γ, the drafters, the
draft's vocabulary, calibration, threads, context, seed);
``BatchedSettings`` adds what only the batched decoder does.  Both check
every value when built, so a bad one is refused before any model loads.

On the command line each setting is a flag (``--gamma``), and in the
environment a variable (``SPECDEC_GAMMA``) that sets the flag's default:
the flag wins, then the variable, then the declared default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from .core.request_args import GAMMA_LIMIT

__all__ = ["BadEnvironment", "BatchedSettings", "DecoderSettings", "Option", "add_flags", "env_name", "env_errors",
           "from_flags", "parse_gamma"]

GammaSetting = Union[int, str]
CALIBRATIONS = ("auto", "cached", "measure")
#: The most tokens a decoder's context may hold (``n_ctx``).
N_CTX_LIMIT = 1 << 20


# ---------------------------------------------------------------- parsers and checks
def _int_in(lo: int, hi: Optional[int] = None, *, none: bool = False) -> Callable[[Any], None]:
    span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    expected = f"an int {span}{' or None' if none else ''}"

    def check(value: Any) -> None:
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"must be {expected}, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            raise ValueError(f"must be {expected}, got {value!r}")
    return check


def _check_gamma(value: Any) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= GAMMA_LIMIT:
        raise ValueError(f"must be 'auto' or an int in [0, {GAMMA_LIMIT}], got {value!r}")


def parse_gamma(text: str) -> GammaSetting:
    """A γ as text: ``auto`` or an int in [0, GAMMA_LIMIT] (ValueError otherwise)."""
    value = "auto" if text.strip().lower() == "auto" else _parse_int(text)
    _check_gamma(value)
    return value


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, got {text!r}")


def _check_bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"must be True or False, got {value!r}")


def _parse_calibration(text: str) -> Optional[str]:
    low = text.strip().lower()
    if low == "none":
        return None
    if low not in CALIBRATIONS:
        raise ValueError(f"must be one of {', '.join(CALIBRATIONS)} or none, got {text!r}")
    return low


def _check_calibration(value: Any) -> None:
    from .planning.costmodel import CostModel

    if not (value is None or isinstance(value, CostModel) or value in CALIBRATIONS):
        raise ValueError(f"must be 'auto', 'cached', 'measure', a CostModel or None, got {value!r}")


def _check_chat_template(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"must be a file path, template text or None, got {value!r}")
    from .chat.template import ChatTemplate, load_template_source
    from .errors import ChatTemplateError

    try:  # read and compiled now: a bad file is refused before any model loads
        source, name = load_template_source(value)
        ChatTemplate(source, name=name)
    except ChatTemplateError as exc:
        raise ValueError(str(exc)) from None


def _check_path(value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"must be a file path or None, got {value!r}")


def _check_ngram_kwargs(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a dict of NgramDrafter settings or None, got {value!r}")
    from .drafters.ngram import NgramDrafter

    NgramDrafter(**value)  # its own ValueError/TypeError names a bad setting


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Option:
    """How one setting is spelt outside Python: its flag, variable and help.

    ``parse`` turns a flag's or variable's text into a value (ValueError
    saying what was expected); ``check`` refuses a bad value from any source.
    ``flag=None`` keeps a setting out of the command line (a dict, say).
    """

    help: str
    check: Callable[[Any], None]
    parse: Callable[[str], Any] = _parse_int
    flag: Optional[str] = ""
    metavar: str = "N"
    aliases: tuple[str, ...] = ()

    def flag_name(self, name: str) -> Optional[str]:
        if self.flag is None:
            return None
        return self.flag or "--" + name.replace("_", "-")


def _opt(default: Any, help: str, check: Callable[[Any], None], **kw: Any) -> Any:
    return field(default=default, metadata={"option": Option(help=help, check=check, **kw)})


@dataclass(frozen=True)
class DecoderSettings:
    """What a decoder runs with, besides its model files (checked on construction)."""

    gamma: GammaSetting = _opt(
        "auto", "draft tokens per step: 'auto' lets the planner choose per step from measured costs "
        "and acceptance, N fixes it, 0 is plain decoding", _check_gamma, parse=parse_gamma,
        metavar="auto|N")
    gamma_max: int = _opt(12, "the longest draft-model draft 'auto' may choose", _int_in(1, GAMMA_LIMIT))
    ngram: bool = _opt(False, "also draft by prompt lookup (n-gram matches in the text so far)", _check_bool,
                       parse=_parse_bool)
    ngram_kwargs: Optional[dict] = _opt(None, "NgramDrafter settings (max_ngram, min_ngram, max_draft, "
                                        "unwrap_lines); needs ngram", _check_ngram_kwargs, flag=None)
    draft_vocab: Optional[int] = _opt(
        None, "draft with a copy of the draft cut to its first N ids and its control tokens (written "
        "once to the cache): cheaper draft passes, the same exact output. 98304 suits Qwen2.5 drafts "
        "on English and code", _int_in(1, 1 << 24, none=True))
    calibration: Any = _opt(
        "auto", "the pair's costs: 'auto' (the stored calibration; learnt from the first passes when "
        "there is none), 'cached' (stored or none), 'measure' (a full calibration now) or 'none' "
        "(priors, learnt online)", _check_calibration, parse=_parse_calibration, metavar="auto|cached|measure|none")
    n_threads: Optional[int] = _opt(None, "CPU threads per model (default: all cores)", _int_in(1, 1024, none=True),
                                    flag="--threads")
    n_ctx: int = _opt(4096, "the most tokens one sequence may hold (prompt and output)", _int_in(16, N_CTX_LIMIT),
                      flag="--ctx", aliases=("--n-ctx",))
    n_batch: int = _opt(512, "the most rows of one llama.cpp pass (a verify pass holds γ + 1)", _int_in(1, 1 << 16))
    chat_template: Optional[str] = _opt(
        None, "a Jinja chat template FILE (or the template's text) used instead of the model's own "
        "tokenizer.chat_template, for chat prompts with tools and tool calls", _check_chat_template,
        parse=str, metavar="FILE")
    seed: Optional[int] = _opt(None, "seed of the random streams (requests without a seed of their own "
                               "draw from streams derived from it)", _int_in(0, 2**64 - 1, none=True))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            try:
                f.metadata["option"].check(getattr(self, f.name))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{f.name} {exc}") from None
        if self.ngram_kwargs is not None and not self.ngram:
            raise ValueError("ngram_kwargs needs ngram=True")

    def replace(self, **changes: Any) -> "DecoderSettings":
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def check_drafter(self, has_draft: bool) -> None:
        """A fixed γ > 0 needs something to draft with."""
        if not (has_draft or self.ngram) and self.gamma not in (0, "auto"):
            raise ValueError(f"gamma={self.gamma} needs a drafter: pass a draft model, ngram=True, or gamma=0")
        if self.draft_vocab is not None and not has_draft:
            raise ValueError("draft_vocab needs a draft model to cut")


@dataclass(frozen=True)
class BatchedSettings(DecoderSettings):
    """``DecoderSettings`` and what only a batched decoder takes."""

    max_sequences: int = _opt(8, "requests decoded at once (each one llama.cpp sequence)", _int_in(1, 256))
    max_queue: int = _opt(64, "requests that may wait for a free sequence (beyond: refused)", _int_in(0))
    prefill_chunk: int = _opt(128, "prompt tokens taken in per step while other requests decode", _int_in(1))
    embedding_model: Optional[str] = _opt(
        None, "a GGUF model that answers embeddings (/v1/embeddings; an embedding model such as nomic-embed or "
        "bge); default: the target's own hidden states, mean-pooled", _check_path, parse=str, metavar="FILE")
    embedding_max_tokens: int = _opt(512, "the longest text an embedding takes, in tokens (also the tokens of "
                                     "one embedding pass)", _int_in(8, 1 << 16))


# ---------------------------------------------------------------- command line
def env_name(name: str) -> str:
    """The environment variable of setting ``name``."""
    return "SPECDEC_" + name.upper()


class BadEnvironment:
    """The default of a flag whose environment variable does not parse.

    It stands in for the value, so that the error waits until a command
    that has the flag runs without it (``--help`` and the flag itself still
    work): ``env_errors`` and ``from_flags`` report it."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __str__(self) -> str:
        return f"unusable: {self.message}"


def env_errors(args: argparse.Namespace) -> list[str]:
    """What is wrong with the environment variables behind the parsed flags
    that were not given (none when every one parsed)."""
    return [v.message for v in vars(args).values() if isinstance(v, BadEnvironment)]


def add_flags(group: "argparse._ActionsContainer", settings: type = DecoderSettings,
              names: Optional[tuple[str, ...]] = None, defaults: Optional[Mapping[str, Any]] = None) -> None:
    """Add a flag for each setting of ``settings`` (or of ``names``), its
    default from the environment when its variable is set, else from
    ``defaults``, else the declared one.  A variable that does not parse
    becomes a ``BadEnvironment`` default (see ``env_errors``)."""
    defaults = dict(defaults or {})
    for f in dataclasses.fields(settings):
        opt: Option = f.metadata["option"]
        flag = opt.flag_name(f.name)
        if flag is None or (names is not None and f.name not in names):
            continue
        default = _env_default(f.name, opt, flag, defaults.get(f.name, f.default))
        help_text = f"{opt.help} (default {_show(default)}; env {env_name(f.name)})"
        if opt.parse is _parse_bool:
            group.add_argument(flag, *opt.aliases, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=default, help=help_text)
        else:
            group.add_argument(flag, *opt.aliases, dest=f.name, type=_argtype(opt), default=default,
                               metavar=opt.metavar, help=help_text)


def from_flags(args: argparse.Namespace, settings: type = DecoderSettings, **extra: Any) -> Any:
    """The ``settings`` object of parsed flags (and ``extra`` values).

    A bad combination, or a bad environment variable behind a flag not
    given, raises ValueError naming the setting."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(settings) if hasattr(args, f.name)}
    values.update(extra)
    bad = env_errors(argparse.Namespace(**values))
    if bad:
        raise ValueError("; ".join(bad))
    return settings(**values)


def _env_default(name: str, opt: Option, flag: str, default: Any) -> Any:
    text = os.environ.get(env_name(name))
    if text is None:
        return default
    try:
        value = opt.parse(text)
        opt.check(value)
    except (TypeError, ValueError) as exc:
        return BadEnvironment(f"environment variable {env_name(name)} {exc} (fix or unset it, or give {flag})")
    return value


def _argtype(opt: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = opt.parse(text)
            opt.check(value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    parse.__name__ = "value"  # argparse names the type in some messages
    return parse


def _show(value: Any) -> str:
    return "none" if value is None else str(value)

"""What both decoders' public faces share: turning a call's arguments into a
checked :class:`Sequence`, chat prompts, the policy they plan with, and the
end of ``generate``."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import threading
import warnings
from typing import Any, Iterator, Optional, Type, TypeVar
from typing import Sequence as Seq

from ..chat.messages import template_messages
from ..core.infill import infill_tokens
from ..core.penalties import Penalties
from ..core.protocols import SequenceLM, Tokenizer, eog_id_array
from ..core.request_args import Prompt, chat_prompt, check_request, prompt_tokens
from ..core.sequence import GammaSetting, SeedSequence, Sequence
from ..core.stats import Generation
from ..core.text import TextAssembler
from ..errors import ChatTemplateError, ChatTemplateRefusal, DecoderClosedError, GenerationCancelled
from ..params import SamplingParams
from ..planning.costmodel import CostModel
from ..planning.policy import DraftPolicy

__all__ = ["CallerCalls", "DecoderFront"]

S = TypeVar("S", bound=Sequence)


class CallerCalls:
    """Calls into the models made in the callers' threads (tokenizing,
    rendering a prompt, compiling a grammar), outside the decoder's own
    thread and lock: counted, so that ``close`` frees the models only once
    they are out (freed under a running call, llama.cpp reads freed memory)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._cond = threading.Condition()
        self._inside = 0
        self._closed = False

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """Around one such call; ``DecoderClosedError`` once closed."""
        with self._cond:
            if self._closed:
                raise DecoderClosedError(f"this {self._owner} is closed")
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Refuse new calls and wait for those running (never from inside one)."""
        with self._cond:
            self._closed = True
            while self._inside:
                self._cond.wait()


class DecoderFront:
    """The shared half of ``SpeculativeDecoder`` and ``BatchedDecoder``.

    A subclass sets ``tokenizer``, ``gamma``, ``gamma_max``, ``_target_lm``
    (the target as a ``SequenceLM``), ``_has_drafter``, ``_seeds`` and
    ``_closed`` and ``_calls`` (a ``CallerCalls``, closed by ``close``
    before the models are freed), and implements ``generate``/``stream``/``close``.
    """

    tokenizer: Tokenizer
    gamma: GammaSetting
    gamma_max: int
    _target_lm: SequenceLM
    _has_drafter: bool
    _seeds: SeedSequence
    _closed: bool
    _calls: CallerCalls

    # ------------------------------------------------------------ chat
    def chat(self, messages: Seq[dict], **kwargs: Any) -> Generation:
        """``generate`` on the target's chat template applied to ``messages``.

        Later turns reuse the cached common prefix of the conversation."""
        return self.generate(self.chat_prompt(messages), **kwargs)  # type: ignore[attr-defined]

    def chat_stream(self, messages: Seq[dict], **kwargs: Any) -> Any:
        """``stream`` on the target's chat template applied to ``messages``."""
        return self.stream(self.chat_prompt(messages), **kwargs)  # type: ignore[attr-defined]

    def chat_prompt(self, messages: Seq[dict], *, tools: Optional[Seq[dict]] = None,
                    add_generation_prompt: bool = True, chat_template_kwargs: Optional[dict] = None) -> str:
        """The chat prompt of ``messages`` (OpenAI's shape: tool calls of
        assistant turns and ``tool`` results included) offering ``tools``.

        Rendered by the ``chat_template`` setting (a file or template text)
        if set, else by the target's own ``tokenizer.chat_template``, in a
        sandboxed Jinja environment (``chat.ChatTemplate``).  llama.cpp's
        built-in matcher is the fallback for a model without a template, or
        whose own template fails to render plain messages.

        Raises ``InvalidPromptError`` (malformed messages),
        ``ChatTemplateRefusal`` (the template refused them), ``ChatTemplateError``
        (the template failed), ``ValueError`` (no template at all, or tools
        or tool calls that only a Jinja template can render).
        """
        with self._calls.open():
            return self._render_chat(messages, tools, add_generation_prompt, chat_template_kwargs)

    def _render_chat(self, messages: Seq[dict], tools: Optional[Seq[dict]], add_generation_prompt: bool,
                     chat_template_kwargs: Optional[dict]) -> str:
        template = self._chat_template()
        if template is not None:
            try:
                return template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                       chat_template_kwargs=chat_template_kwargs)
            except ChatTemplateRefusal:
                raise
            except ChatTemplateError as exc:
                # An override is the user's explicit choice; the model's own
                # template may fall back, where the matcher can say the same.
                if self.chat_template is not None or tools or chat_template_kwargs:
                    raise
                failure: Optional[Exception] = exc
        else:
            failure = None
        plain = template_messages(messages)
        if tools or chat_template_kwargs or any(m.get("tool_calls") or m["role"] == "tool" for m in plain):
            what = "tools" if tools else "chat_template_kwargs" if chat_template_kwargs else "tool calls and results"
            why = f" ({failure})" if failure is not None else ": the model has no Jinja chat template"
            raise ValueError(f"{what} need a Jinja chat template{why}; give one with --chat-template")
        if failure is not None:
            warnings.warn(f"{failure}; using llama.cpp's built-in template matcher instead", RuntimeWarning,
                          stacklevel=2)
        if not add_generation_prompt:
            text = self.tokenizer.chat_prompt([{"role": m["role"], "content": m["content"]} for m in plain],
                                              add_generation_prompt=False)
            if text is None:
                raise ValueError("the target model has no chat template; use generate() with a raw prompt")
            return text
        return chat_prompt(self.tokenizer, [{"role": m["role"], "content": m["content"]} for m in plain])

    #: The ``chat_template`` setting: a Jinja file or template text used
    #: instead of the model's own template (None: the model's).
    chat_template: Optional[str] = None

    def set_chat_template(self, spec: Optional[str]) -> None:
        """Render chat prompts with ``spec`` (a file or template text; None:
        the model's own template).  Read and compiled now: ``ChatTemplateError``."""
        from ..chat import ChatTemplate

        compiled = ChatTemplate.for_model(self.tokenizer, spec)
        self.chat_template = spec
        self._compiled_template = (spec, compiled)

    def _chat_template(self) -> Any:
        """The compiled template chat prompts are rendered with, or None."""
        cached = getattr(self, "_compiled_template", None)
        if cached is not None and cached[0] == self.chat_template:
            return cached[1]
        from ..chat import ChatTemplate

        compiled = ChatTemplate.for_model(self.tokenizer, self.chat_template)
        self._compiled_template = (self.chat_template, compiled)
        return compiled

    def infill_prompt(self, prefix: str, suffix: str, extra: Seq[dict] = ()) -> list[int]:
        """The prompt (token ids) for fill-in-the-middle between ``prefix``
        and ``suffix`` with the target's FIM tokens; ``extra``: other files
        as ``{"filename", "text"}`` (core/infill.py).  ``InfillUnsupportedError``
        for a model without FIM tokens."""
        with self._calls.open():
            return infill_tokens(self.tokenizer, prefix, suffix, extra)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """The token ids a request with this prompt would decode (checked as
        a request's prompt is: ``InvalidPromptError``, ``ContextOverflowError``;
        ``DecoderClosedError`` once closed)."""
        with self._calls.open():
            return prompt_tokens(prompt, self.tokenizer, self._target_lm.n_vocab, self.n_ctx)

    @property
    def n_ctx(self) -> int:
        """The most tokens one request may hold (prompt + output)."""
        return self._target_lm.n_ctx

    @property
    def n_vocab(self) -> int:
        """The target's vocabulary size (token ids are below it)."""
        return self._target_lm.n_vocab

    @property
    def has_drafter(self) -> bool:
        """Whether the decoder can draft at all (a draft model or prompt lookup)."""
        return self._has_drafter

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise DecoderClosedError(f"this {type(self).__name__} is closed")

    def grammar_state(self, grammar: Any) -> Any:
        """A fresh matcher of ``grammar`` for this decoder's vocabulary: a
        ``constraints.Grammar``, or a JSON schema (a dict, or a pydantic
        model class).  Compiled once per grammar (cached); an invalid one
        raises ``InvalidGrammarError`` naming what is wrong."""
        from ..constraints import Grammar, compile_grammar

        if not isinstance(grammar, Grammar):
            grammar = Grammar.json_schema(grammar)
        tok = self.tokenizer
        with self._calls.open():
            if hasattr(tok, "grammar_tokenizer"):  # a tokenizer of the tests' synthetic models
                llg = tok.grammar_tokenizer()
            else:
                from ..engine import llg_tokenizer

                llg = llg_tokenizer(tok.weights)  # type: ignore[attr-defined]
            return compile_grammar(grammar, llg, param="grammar").new_state()

    def _sequence(self, cls: Type[S], prompt: Prompt, max_tokens: int, params: SamplingParams, stop: Optional[Seq[str]],
                  gamma: Optional[GammaSetting], cancel: Optional[threading.Event], timeout: Optional[float],
                  gamma_limit: int, *, grammar: Any = None, logprobs: Optional[int] = None,
                  logprob_mode: str = "model", prompt_logprobs: Optional[int] = None) -> S:
        """A checked sequence for one call (its seed is drawn later, by the
        caller, once the request is accepted); a fixed γ above
        ``gamma_limit`` drafts ``gamma_limit`` tokens."""
        self._check_open()
        if gamma is None:
            gamma = self.gamma
        n_vocab = self._target_lm.n_vocab
        check_request(max_tokens=max_tokens, params=params, gamma=gamma, has_drafter=self._has_drafter,
                      cancel=cancel, timeout=timeout, n_vocab=n_vocab, logprobs=logprobs, logprob_mode=logprob_mode,
                      prompt_logprobs=prompt_logprobs)
        if isinstance(gamma, int):
            gamma = min(gamma, gamma_limit)
        tokens = self.tokenize(prompt)
        from ..constraints.grammar import Triggered

        trigger = None
        if isinstance(grammar, Triggered):  # the grammar starts after its token: no state until then
            if grammar.token >= n_vocab:
                raise ValueError(f"grammar: trigger token id {grammar.token} is outside the vocabulary [0, {n_vocab})")
            trigger, grammar = grammar.token, grammar.grammar
        state = None if grammar is None else self.grammar_state(grammar)
        seq = cls(tokens, max_tokens=max_tokens, params=params, text=TextAssembler(stop), gamma=gamma,
                  n_vocab=n_vocab, cancel=cancel, timeout=timeout, gamma_rows=min(self.gamma_max, 16))
        if trigger is None:
            seq.constraint = state
        else:
            seq.trigger = (trigger, state)
        seq.logprobs, seq.logprob_mode, seq.prompt_logprobs = logprobs, logprob_mode, prompt_logprobs
        if params.adjusts_logits:
            seq.penalties = Penalties(params, tokens, eog_id_array(self.tokenizer, n_vocab).tolist())
        return seq

    def _seed_of(self, seq: Sequence) -> None:
        """Start ``seq``'s random streams: its own seed, or the decoder's next."""
        seq.set_seed(seq.params.seed if seq.params.seed is not None else self._seeds.next())


def make_policy(cost_model: Optional[CostModel], target: SequenceLM, draft: Optional[SequenceLM], *,
                gamma_max: int, max_rows: Optional[int] = None, **kwargs: Any) -> DraftPolicy:
    """The draft policy of a decoder over these models; ``max_rows``: the
    most rows a planned target pass holds (default: the target's batch)."""
    rows = target.n_batch if max_rows is None else max_rows
    return DraftPolicy(cost_model, max_rows=rows, max_draft_rows=draft.n_batch if draft is not None else 1,
                       has_draft=draft is not None, gamma_max=gamma_max, **kwargs)


def generation_or_raise(gen: Generation, timeout: Optional[float]) -> Generation:
    """``gen``, or ``GenerationCancelled`` (with it as ``partial``) when it was
    cancelled or timed out."""
    if gen.finish_reason in ("cancelled", "timeout"):
        what = ("cancelled by its cancel event" if gen.finish_reason == "cancelled"
                else f"stopped by its timeout of {timeout} s")
        raise GenerationCancelled(f"generation {what} after {len(gen.tokens)} tokens",
                                  partial=gen, reason=gen.finish_reason)
    return gen


def settings_of(settings: Any, kwargs: dict, cls: type) -> Any:
    """The settings of a ``from_gguf`` call: ``settings`` or keywords, not both;
    an unknown keyword is a TypeError naming the closest setting."""
    if settings is not None:
        if kwargs:
            raise TypeError(f"pass settings= or keyword settings, not both (got {', '.join(sorted(kwargs))})")
        if not isinstance(settings, cls):
            raise TypeError(f"settings must be a {cls.__name__}, got {type(settings).__name__}")
        return settings
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        def hint(name: str) -> str:
            close = difflib.get_close_matches(name, known, n=1)
            return f"{name} (did you mean {close[0]}?)" if close else name
        raise TypeError(f"from_gguf got unexpected keyword argument(s) {', '.join(hint(k) for k in unknown)}; "
                        f"its settings are {', '.join(known)}")
    return cls(**kwargs)

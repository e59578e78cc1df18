"""Rendering a model's own chat template (Jinja), as transformers does.

GGUF files carry the template of the model's tokenizer
(``tokenizer.chat_template``).  It is rendered in jinja2's immutable
sandbox with ``trim_blocks`` and ``lstrip_blocks`` and the helpers
transformers provides (``raise_exception``, its ``tojson``,
``strftime_now``, the loop-control and ``{% generation %}`` tags), so a
prompt matches the one the model was trained with, tools and tool calls
included.  llama.cpp's built-in matcher (``LlamaTokenizer.chat_prompt``)
remains the fallback for a GGUF without a template.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..errors import ChatTemplateError, ChatTemplateRefusal
from .messages import template_messages

__all__ = ["ChatTemplate", "load_template_source"]


class _Refusal(Exception):
    """What the template's ``raise_exception`` raises inside jinja."""


def _raise_exception(message: str) -> None:
    raise _Refusal(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[Tuple[str, str]] = None, sort_keys: bool = False) -> str:
    # transformers' filter: jinja's own escapes HTML characters and takes no separators.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment():
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks assistant text
        for training masks in transformers): renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def load_template_source(spec: str) -> Tuple[str, str]:
    """A ``--chat-template`` value as (template text, name): a path to a
    file, or the template's own text when it holds ``{{`` or ``{%``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ChatTemplateError("a chat template must be a file path or template text", "")
    if "{{" in spec or "{%" in spec:
        return spec, "inline chat template"
    try:
        with open(spec, encoding="utf-8") as fh:
            return fh.read(), spec
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ChatTemplateError(f"cannot read chat template file {spec}: {reason}", spec) from None


class ChatTemplate:
    """A compiled chat template.  Thread-safe; render as often as needed.

    Args:
        source: the Jinja text.
        name: what error messages call it (a GGUF path, a file name).
        bos_token, eos_token: the texts templates may print (``{{ bos_token }}``).
    """

    def __init__(self, source: str, *, name: str = "chat template", bos_token: str = "",
                 eos_token: str = "") -> None:
        import jinja2

        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{name} is not valid Jinja (line {exc.lineno}): {exc.message}", name) from None

    @classmethod
    def for_model(cls, tokenizer: Any, override: Optional[str] = None, *,
                  name: Optional[str] = None) -> Optional["ChatTemplate"]:
        """The template for a model: ``override`` (a ``--chat-template``
        file or text) if given, else the tokenizer's own
        (``LlamaTokenizer.chat_template``); None when there is neither.
        BOS/EOS texts come from the tokenizer's ``bos``/``eos`` ids."""
        if override is not None:
            source, name = load_template_source(override)
        else:
            own: Optional[str] = getattr(tokenizer, "chat_template", None)
            if not own:
                return None
            source = own
            weights = getattr(tokenizer, "weights", None)
            name = name or f"the chat template of {getattr(weights, 'path', 'the model')}"
        return cls(source, name=name, bos_token=_token_text(tokenizer, "bos"),
                   eos_token=_token_text(tokenizer, "eos"))

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Optional[Sequence[Mapping[str, Any]]] = None,
               add_generation_prompt: bool = True, chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
        """The prompt text for ``messages`` (OpenAI's shape, tool calls and
        tool results included) and ``tools`` (OpenAI function specs, passed
        as they are).  ``chat_template_kwargs`` are extra template variables
        (e.g. ``enable_thinking``); they may override ``bos_token``.

        Raises InvalidPromptError for malformed messages,
        ChatTemplateRefusal when the template's ``raise_exception`` refuses
        them, ChatTemplateError when rendering fails otherwise.
        """

        context: Dict[str, Any] = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, Mapping):
                raise TypeError("chat_template_kwargs must be a mapping")
            context.update(chat_template_kwargs)
        context.update(messages=template_messages(messages), tools=list(tools) if tools else None,
                       add_generation_prompt=bool(add_generation_prompt))
        try:
            return self._template.render(**context)
        except _Refusal as exc:
            raise ChatTemplateRefusal(f"{self.name} refused the messages: {exc}", self.name) from None
        except Exception as exc:  # the template is code from the model file: whatever it raises is its failure
            # (a jinja2.TemplateError, `'...' + message.content` on another type, a division by zero, ...)
            raise ChatTemplateError(f"{self.name} failed: {type(exc).__name__}: {exc}", self.name) from None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r}, {len(self.source)} chars)"


def _token_text(tokenizer: Any, which: str) -> str:
    token = getattr(tokenizer, which, None)
    text = getattr(tokenizer, "token_text", None)
    if token is None or text is None:
        return ""
    return text(token)

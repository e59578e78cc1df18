"""``Grammar``: what a constrained request asks its output to match.

A ``Grammar`` is a small immutable, hashable value (kind, source text, JSON
layout), so compiled grammars can be cached by it.  Building one checks
only what needs no tokenizer (a JSON schema that is not JSON, a pydantic
class whose schema fails); llguidance checks the rest when it is compiled
(``compile_grammar``), before anything is queued, or earlier by ``check``.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping, Optional, Sequence, Union, get_args

from ..errors import InvalidGrammarError

__all__ = ["Grammar", "GrammarKind", "JsonLayout", "Triggered", "json_options", "from_response_format"]

GrammarKind = Literal["json_schema", "json_object", "lark", "regex", "gbnf"]

#: How JSON output is laid out.  "spaced" is ``json.dumps``'s default
#: (``", "`` and ``": "``, no other whitespace): what chat models write and
#: what Qwen's tool-call format uses; "compact" is ``","`` and ``":"``.  Both
#: fix every separator, so the keys and punctuation of a schema's fixed
#: parts are forced tokens.  "flexible" allows any JSON whitespace between
#: tokens (a model may indent), at the price of fewer forced tokens.
JsonLayout = Literal["spaced", "compact", "flexible"]

_LAYOUTS: Dict[str, Dict[str, Any]] = {
    "spaced": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    "compact": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"},
    "flexible": {"whitespace_flexible": True},
}


def json_options(layout: JsonLayout) -> Dict[str, Any]:
    """llguidance's JSON compile options for ``layout`` (also usable as a
    schema's ``"x-guidance"`` entry inside a Lark ``%json``)."""
    try:
        return dict(_LAYOUTS[layout])
    except KeyError:
        raise ValueError(f"JSON layout must be one of {sorted(_LAYOUTS)}, got {layout!r}") from None


SchemaInput = Union[Mapping[str, Any], str, type]


@dataclass(frozen=True)
class Grammar:
    """A constraint on generated text.

    Build one with the class methods; ``source`` is the schema as JSON text
    (key order kept: llguidance emits properties in schema order) or the
    grammar text.  ``layout`` applies to JSON kinds only.
    """

    kind: GrammarKind
    source: str
    layout: JsonLayout = "spaced"

    def __post_init__(self) -> None:
        if self.kind not in get_args(GrammarKind):
            raise ValueError(f"grammar kind must be one of {get_args(GrammarKind)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise TypeError(f"grammar source must be a str, got {type(self.source).__name__}")
        json_options(self.layout)  # validates

    # -- constructors ----------------------------------------------------

    @classmethod
    def json_schema(cls, schema: SchemaInput, *, layout: JsonLayout = "spaced") -> "Grammar":
        """Output is one JSON value valid under ``schema``: a dict, its JSON
        text, or a pydantic model class (its ``model_json_schema()``)."""
        return cls("json_schema", json.dumps(_schema_dict(schema), ensure_ascii=False), layout)

    @classmethod
    def json_object(cls, *, layout: JsonLayout = "spaced") -> "Grammar":
        """Output is any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls("json_object", '{"type": "object"}', layout)

    @classmethod
    def lark(cls, text: str) -> "Grammar":
        """A Lark grammar in llguidance's dialect (``start`` is the root;
        ``%json {...}`` embeds a JSON schema)."""
        return cls("lark", _text(text, "Lark grammar"))

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        """Output matches ``pattern`` as a whole (Rust regex syntax)."""
        return cls("regex", _text(pattern, "regex"))

    @classmethod
    def gbnf(cls, text: str) -> "Grammar":
        """A llama.cpp GBNF grammar (``root ::= ...``), converted to Lark."""
        return cls("gbnf", _text(text, "GBNF grammar"))

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Grammar":
        """Output is exactly one of ``options`` (vLLM's ``choice``): a Lark
        grammar whose alternatives are the options as string literals."""
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
            raise InvalidGrammarError(f"choices must be a list of strings, got {type(options).__name__}")
        if not options:
            raise InvalidGrammarError("the list of choices is empty")
        for i, option in enumerate(options):
            if not isinstance(option, str):
                raise InvalidGrammarError(f"choice {i} must be a str, got {type(option).__name__}")
            try:
                option.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidGrammarError(f"choice {i} is not valid Unicode (it holds a lone surrogate)") from None
        # A JSON string literal is a Lark string literal with the same escapes; Lark's lexer refuses a raw DEL.
        literals = (json.dumps(option, ensure_ascii=False).replace("\x7f", "\\u007f")
                    for option in dict.fromkeys(options))
        return cls("lark", "start: " + " | ".join(literals))

    @classmethod
    def gbnf_or_lark(cls, text: str) -> "Grammar":
        """A grammar in either format: GBNF when it has ``::=`` rules, else Lark
        (vLLM's ``grammar`` takes both)."""
        return cls.gbnf(text) if isinstance(text, str) and "::=" in text else cls.lark(text)

    # -- for the compiler ------------------------------------------------

    @property
    def what(self) -> str:
        """The kind as a message names it."""
        return {"json_schema": "JSON schema", "json_object": "JSON object grammar", "lark": "Lark grammar",
                "regex": "regex", "gbnf": "GBNF grammar"}[self.kind]

    def check(self) -> None:
        """Raise InvalidGrammarError naming what is wrong, without a tokenizer
        (what a command line wants before it loads a model; compiling for a
        tokenizer checks the grammar again)."""
        from llguidance import LLMatcher

        error = LLMatcher.validate_grammar(self.llguidance_grammar())
        if error:
            raise InvalidGrammarError(f"invalid {self.what}: {first_lines(error)}")

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's serialized form (not yet checked
        against a tokenizer)."""
        from llguidance import LLMatcher

        if self.kind in ("json_schema", "json_object"):
            try:
                return LLMatcher.grammar_from_json_schema(self.source, overrides=json_options(self.layout))
            except ValueError as exc:
                raise InvalidGrammarError(f"invalid {self.what}: {exc}") from None
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            return LLMatcher.grammar_from_lark(any_to_lark(self.source))
        except Exception as exc:  # the converter raises plain Exception
            raise InvalidGrammarError(f"invalid GBNF grammar: {exc}") from None


@dataclass(frozen=True)
class Triggered:
    """A grammar that applies only once the output has emitted ``token``
    (llama.cpp's lazy grammar): the text before it is free, and the grammar
    matches what follows it, as a tool call after ``<tool_call>``.

    Exact under speculation: a step keeps its tokens up to the trigger only
    (the ones after it were verified without the grammar), and every later
    position is sampled from the target masked by it (docs/math.md §11)."""

    grammar: Grammar
    token: int

    def __post_init__(self) -> None:
        if not isinstance(self.grammar, Grammar):
            raise TypeError(f"Triggered.grammar must be a Grammar, got {type(self.grammar).__name__}")
        try:
            token = operator.index(self.token)  # an int, or a numpy integer
        except TypeError:
            token = -1
        if isinstance(self.token, bool) or token < 0:
            raise ValueError(f"Triggered.token must be a token id (an int >= 0), got {self.token!r}")
        object.__setattr__(self, "token", token)


def first_lines(message: str, limit: int = 600) -> str:
    """The reason of an llguidance error: some append the grammar and the
    parser's state, which an error message does not want."""
    message = message.split("\n<state>", 1)[0].strip()
    return message if len(message) <= limit else message[:limit] + " ..."


def _text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise InvalidGrammarError(f"a {what} must be a str, got {type(text).__name__}")
    if not text.strip():
        raise InvalidGrammarError(f"the {what} is empty")
    return text


def _schema_dict(schema: SchemaInput) -> Dict[str, Any]:
    if isinstance(schema, type):
        model = schema
        to_schema = getattr(model, "model_json_schema", None)
        if to_schema is None:
            raise InvalidGrammarError(f"a JSON schema class must be a pydantic model, got {model.__name__}")
        try:
            schema = to_schema()
        except Exception as exc:  # pydantic's schema generation errors
            raise InvalidGrammarError(f"pydantic model {model.__name__} has no JSON schema: {exc}") from None
    elif isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidGrammarError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, Mapping):
        raise InvalidGrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    return dict(schema)


def from_response_format(response_format: Optional[Mapping[str, Any]], *,
                         layout: JsonLayout = "spaced") -> Optional[Grammar]:
    """The grammar an OpenAI ``response_format`` asks for: None for
    ``{"type": "text"}`` (or None), any JSON object for ``"json_object"``,
    ``json_schema.schema`` for ``"json_schema"``.  Errors name the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise InvalidGrammarError("response_format must be an object", param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object(layout=layout)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidGrammarError("response_format.json_schema must be an object",
                                      param="response_format.json_schema")
        schema = spec.get("schema", {"type": "object"})
        try:
            return Grammar.json_schema(schema, layout=layout)
        except InvalidGrammarError as exc:
            raise InvalidGrammarError(str(exc), param="response_format.json_schema.schema") from None
    raise InvalidGrammarError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                              f"got {kind!r}", param="response_format.type")

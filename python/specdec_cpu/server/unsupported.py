"""The request fields the server knows but does not act on, in one place.

Three kinds, each a table below:

* :data:`REFUSED` -- fields that would change the output (OpenAI's, and the
  llama-server / vLLM spellings clients send) which the server does not
  honour yet.  They are accepted only at their neutral value (the one that
  asks for nothing: ``typical_p: 1``, ``mirostat: 0``, ``null``); any other
  value is a 400 naming the field (code ``unsupported_parameter``).  To
  honour one, delete its row here and give the request models a real field.
* :data:`IGNORED` -- fields that cannot change the output (``user``,
  ``metadata``, ``store``, ...): accepted and ignored.
* anything else -- a 400 ``unknown_parameter`` naming it (the request
  models forbid extra fields): a typo such as ``temprature`` or another
  server's sampler would otherwise be ignored silently, as OpenAI's own API
  refuses unrecognised arguments.

The request models take both tables' fields with :func:`model_fields`, so
``/openapi.json`` documents them (a refused field's schema lists its
neutral values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["Refused", "REFUSED", "IGNORED", "REFUSED_IN_STRUCTURED_OUTPUTS", "model_fields", "model_validators",
           "refused_fields", "refusing_validators"]

COMPLETIONS, CHAT = "completions", "chat"
BOTH = (COMPLETIONS, CHAT)


@dataclass(frozen=True)
class Refused:
    """A field the server does not honour: only ``neutral`` values (and
    null) are accepted.  ``instead`` says what to use, if anything."""

    name: str
    neutral: Tuple[Any, ...] = ()
    instead: str = ""
    endpoints: Tuple[str, ...] = BOTH

    def accepts(self, value: Any) -> bool:
        return value is None or any(_same(value, n) for n in self.neutral)

    def message(self, value: Any) -> str:
        allowed = " or ".join(["null", *(_json(n) for n in self.neutral)])
        text = f"{self.name}={_json(value)} is not supported by this server (accepted: {allowed})"
        return f"{text}; {self.instead}" if self.instead else text


# Sampling methods the decoding core does not implement, other servers'
# spellings of what it does, and OpenAI fields of features it lacks.
REFUSED: Tuple[Refused, ...] = (
    Refused("typical_p", (1,)),
    Refused("mirostat", (0,)),
    Refused("guided_whitespace_pattern", instead="JSON is laid out with ', ' and ': ' and no other whitespace"),
    Refused("reasoning_effort", endpoints=(CHAT,)),
    Refused("verbosity", endpoints=(CHAT,)),
    Refused("modalities", (["text"],), endpoints=(CHAT,)),
    Refused("audio", endpoints=(CHAT,)),
    Refused("web_search_options", endpoints=(CHAT,)),
)

#: Fields that cannot change the output: accepted, ignored.  (name, type, what it is)
IGNORED: Tuple[Tuple[str, Any, str], ...] = (
    ("user", Optional[str], "an end-user id (OpenAI); ignored"),
    ("metadata", Optional[Dict[str, Any]], "tags for stored completions (OpenAI); ignored"),
    ("store", Optional[bool], "store the completion (OpenAI); ignored, nothing is stored"),
    ("service_tier", Optional[str], "OpenAI's processing tier; ignored"),
    ("prompt_cache_key", Optional[str], "OpenAI's cache routing hint; ignored (prompt prefixes are always reused)"),
    ("safety_identifier", Optional[str], "an end-user id (OpenAI); ignored"),
    ("cache_prompt", Optional[bool], "llama-server's prompt cache switch; ignored (prefixes are always reused, "
                                     "which does not change the output's distribution)"),
    ("prediction", Optional[Dict[str, Any]], "OpenAI's predicted output (a latency hint); ignored"),
    ("guided_decoding_backend", Optional[str], "vLLM's choice of grammar engine; ignored (there is one)"),
)

#: Fields of vLLM's ``structured_outputs`` object it does not honour.
REFUSED_IN_STRUCTURED_OUTPUTS: Tuple[Refused, ...] = (
    Refused("structured_outputs.whitespace_pattern",
            instead="JSON is laid out with ', ' and ': ' (disable_any_whitespace: false allows any whitespace)"),
    Refused("structured_outputs.structural_tag"),
    Refused("structured_outputs.disable_additional_properties", (False,),
            instead="set additionalProperties: false in the schema"),
)


def model_fields(endpoint: str) -> Dict[str, Tuple[Any, Any]]:
    """The refused and ignored fields of ``endpoint`` as ``pydantic.create_model``
    field definitions."""
    fields = refused_fields([row for row in REFUSED if endpoint in row.endpoints])
    for name, annotation, what in IGNORED:
        fields[name] = (annotation, Field(default=None, description=what))
    return fields


def model_validators(endpoint: str) -> Dict[str, Callable]:
    """The validator refusing non-neutral values (``create_model``'s ``__validators__``)."""
    return refusing_validators([row for row in REFUSED if endpoint in row.endpoints])


def refused_fields(rows: Sequence[Refused]) -> Dict[str, Tuple[Any, Any]]:
    """``rows`` as ``create_model`` field definitions (named by the last part
    of a dotted name: the field of a nested object)."""
    fields: Dict[str, Tuple[Any, Any]] = {}
    for row in rows:
        values = [None, *row.neutral]
        fields[_field(row)] = (Any, Field(default=None, json_schema_extra={
            "enum": values, "description": f"Not supported: only {', '.join(_json(v) for v in values)}"}))
    return fields


def refusing_validators(rows: Sequence[Refused]) -> Dict[str, Callable]:
    """The validator of ``refused_fields(rows)`` (``create_model``'s ``__validators__``)."""
    by_field = {_field(row): row for row in rows}

    def refuse(cls: type, value: Any, info: ValidationInfo) -> Any:
        row = by_field[info.field_name]
        if not row.accepts(value):
            raise PydanticCustomError("unsupported_parameter", row.message(value))
        return value

    return {"_refused": field_validator(*by_field)(refuse)}


def _field(row: Refused) -> str:
    return row.name.rsplit(".", 1)[-1]


def _same(value: Any, neutral: Any) -> bool:
    # JSON's true is not 1 and 1 is not true (Python's == says they are).
    if isinstance(value, bool) or isinstance(neutral, bool):
        return isinstance(value, bool) and isinstance(neutral, bool) and value == neutral
    if isinstance(neutral, (int, float)):
        return isinstance(value, (int, float)) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _json(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)

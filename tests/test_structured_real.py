"""Structured output on the demo pair: every output is valid.

50 generations at T = 1 (γ = 4, a batch of requests in flight) over JSON
schemas of several shapes — nested objects, arrays of records, enums,
numbers with bounds, optional fields — each output parsed and validated
with ``jsonschema`` (not by the matcher that produced it).  And a greedy
output under a schema is the same at γ = 0 and γ = 4.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from real_models import default_pair

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder

pytestmark = pytest.mark.real_model

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": NAME,
            "address": {"type": "object",
                        "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False},
        },
        "required": ["name", "address"], "additionalProperties": False,
    },
    "records": {
        "type": "object",
        "properties": {"people": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": False}}},
        "required": ["people"], "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                       "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["sentiment", "confidence"], "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {"title": NAME, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                       "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}}},
        "required": ["title"], "additionalProperties": False,
    },
    "call": {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": {
            "type": "object", "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False,
    },
}
PROMPTS = {
    "nested": "Extract the person and their address as JSON: Maria Lopez lives at 12 Elm Street, Springfield 62704.",
    "records": "List the people and their ages as JSON: Tom is 31, his daughter Ann is 4.",
    "enum": "Classify the sentiment of this review as JSON: 'The battery died after two days.'",
    "optional": "Describe the film as JSON: Alien, a 1979 science-fiction horror film.",
    "call": "Call the weather tool for Paris in celsius. Answer with the call as JSON.",
}


def chat(dec, key: str) -> str:
    return dec.chat_prompt([{"role": "user", "content": PROMPTS[key]}])


def test_fifty_sampled_outputs_are_valid_json_for_their_schemas() -> None:
    target, draft = default_pair()
    with BatchedDecoder.from_gguf(target, draft, gamma=4, n_ctx=2048, max_sequences=4, seed=5,
                                  calibration=None) as dec:
        params = SamplingParams(temperature=1.0)
        streams = [(key, dec.stream(chat(dec, key), max_tokens=160, params=params, grammar=SCHEMAS[key]))
                   for key in SCHEMAS for _ in range(10)]
        drafted = forced = 0
        for key, stream in streams:
            text = "".join(stream)
            gen = stream.result
            assert gen.finish_reason == "stop", (key, text)
            jsonschema.validate(json.loads(text), SCHEMAS[key])
            drafted, forced = drafted + gen.stats.drafted, forced + gen.stats.forced
    assert drafted > 0 and forced > 0  # drafts and free forced tokens both ran


def test_greedy_structured_output_is_the_same_with_and_without_drafting() -> None:
    target, draft = default_pair()
    greedy = SamplingParams(temperature=0.0)
    outs = []
    for gamma in (0, 4):
        with SpeculativeDecoder.from_gguf(target, draft if gamma else None, gamma=gamma, n_ctx=1024,
                                          calibration=None) as dec:
            outs.append([dec.generate(chat(dec, key), max_tokens=160, params=greedy, grammar=SCHEMAS[key]).text
                         for key in ("records", "call")])
    assert outs[0] == outs[1]
    for key, text in zip(("records", "call"), outs[1]):
        jsonschema.validate(json.loads(text), SCHEMAS[key])

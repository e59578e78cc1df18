"""The server against its own contract, checked by a client no one here wrote.

schemathesis reads ``/openapi.json`` and generates requests for every
operation in it: valid ones (which must be accepted) and invalid ones (which
must be refused with a 4xx).  Every answer is checked against the document:
no 5xx, a documented status code and content type, a body that matches the
documented schema.  Generation runs through the real step with speculation
on (a fixed gamma with a draft model), and the last test asserts drafting
happened, so the requests exercised the speculative path, not only the
validators.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis import checks  # noqa: E402
from server_thread import ThreadServer  # noqa: E402

N_CTX = 512
N_VOCAB = 384
GAMMA = 2
MAX_REQUESTS = 2 + 64  # prompts × n of one request: what the live server below runs and queues at once
#: Generated cases per operation and mode.  The suite's are the same every
#: run; SPECDEC_FUZZ_EXAMPLES=500 (say) fuzzes harder, with fresh cases.
EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "12"))
DERANDOMIZE = "SPECDEC_FUZZ_EXAMPLES" not in os.environ


@pytest.fixture(scope="module")
def live_server(tiny_dir, tiny_draft):
    """A tiny target with fill-in-the-middle tokens (so that ``/infill`` and
    ``suffix`` are served) and a draft sharing its vocabulary."""
    from tiny_gguf import write_tiny_model

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    path = tiny_dir / "fim_contract.gguf"
    if not path.exists():
        write_tiny_model(path, n_vocab=N_VOCAB, seed=0, n_layer=2, fim=("pre", "suf", "mid", "pad", "rep", "sep"))

    def load():
        return BatchedDecoder.from_gguf(str(path), tiny_draft, max_sequences=2, n_ctx=N_CTX, n_threads=1,
                                        gamma=GAMMA)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as s:
        yield s


#: Every operation the document must hold; a new endpoint joins this list,
#: so that it is fuzzed too (the first test fails until it does).  Invalid
#: requests are generated for those with a body (the others take no input
#: but an id in their path).
OPERATIONS = [
    "GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{model}", "POST /v1/completions",
    "POST /v1/chat/completions", "POST /v1/responses", "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}", "GET /v1/responses/{response_id}/input_items", "POST /infill",
    "POST /tokenize", "POST /detokenize", "POST /v1/embeddings", "POST /v1/responses/{response_id}/cancel",
]


@pytest.fixture(scope="module")
def api_schema(live_server):
    return schemathesis.openapi.from_url(live_server.url + "/openapi.json")


def test_the_document_lists_every_operation(api_schema) -> None:
    listed = sorted(result.ok().label for result in api_schema.get_all_operations())
    assert listed == sorted(OPERATIONS)


# schemathesis' own pytest plugin (``from_fixture``) does not run under
# pytest 9, so each operation's cases are drawn from its strategies here.
@pytest.mark.parametrize("label, mode", [(op, "positive") for op in OPERATIONS]
                         + [(op, "negative") for op in OPERATIONS if op.startswith("POST") and "{" not in op])
def test_every_operation_keeps_the_documented_contract(api_schema, label: str, mode: str) -> None:
    """Valid requests must be accepted and answered as documented; invalid
    ones refused with a documented 4xx, never a 5xx."""
    from hypothesis import given

    operation = api_schema.find_operation_by_label(label)
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    def check(case) -> None:
        if mode == "positive":
            valid_beyond_the_schema(case.body)
        response = case.call(timeout=120)
        excluded = []
        if response.status_code == 400 and "context_length_exceeded" in response.text:
            # A prompt's length in tokens is no property JSON Schema can bound.
            excluded = [checks.positive_data_acceptance]
        try:
            case.validate_response(response, excluded_checks=excluded)
        except BaseException:  # schemathesis' own reproduction masks token-like fields ("[Filtered]")
            print("request body:", json.dumps(case.body, default=repr))
            raise

    check()


#: Fields that name the same thing: a request gives one of each group.
GIVE_ONE = [("max_completion_tokens", "max_tokens", "n_predict"), ("repeat_penalty", "repetition_penalty"),
            ("logprobs", "n_probs"), ("response_format", "json_schema", "grammar", "structured_outputs",
                                      "guided_json", "guided_regex", "guided_choice", "guided_grammar")]
ANY_OBJECT = {"type": "object"}
#: A valid grammar of each field that takes one as text or data (the choices of a choice are any texts).
VALID_GRAMMAR = {"grammar": 'root ::= "yes" | "no"', "json_schema": ANY_OBJECT, "guided_json": ANY_OBJECT,
                 "guided_regex": "(yes|no)!", "guided_grammar": 'start: "yes" | "no"', "json": ANY_OBJECT,
                 "regex": "[a-z]{2}"}


def valid_beyond_the_schema(body) -> None:
    """Make a schema-valid request valid where JSON Schema cannot say what
    is: one field of each group of synonyms, ``best_of`` equal to ``n``, and
    a valid grammar or JSON schema where one is passed as data, ``min_tokens``
    within the output limit, ``tool_choice`` (``function_call``) naming an
    offered tool, tools (functions) of distinct names and not both forms of
    them, a ``function`` message's name, ``logit_bias`` keys that are token
    ids of the vocabulary, a text prompt with ``suffix``, no more prompts'
    choices than the server allows, chat's ``top_logprobs`` with
    ``logprobs``, no ``suffix`` with ``echo`` and ``logprobs``,
    ``max_tokens`` 0 only with them, no Responses logprobs with tools, no
    ``previous_response_id`` (none is stored under a generated id), no
    two input items with one id, and a background response stored and not
    streamed.  Their refusals are tested in
    test_server_sampling.py and test_server_structured.py."""
    if not isinstance(body, dict):
        return
    if body.get("top_logprobs") is not None and "messages" in body:
        body["logprobs"] = True
    for group in GIVE_ONE:
        given = [name for name in group if body.get(name) is not None]
        for name in given[1:]:
            del body[name]
    if body.get("suffix") and not isinstance(body.get("prompt"), str):  # the text before the middle
        body["prompt"] = "def f(x):"
    scored = body.get("echo") and (body.get("logprobs") is not None or body.get("n_probs"))
    if body.get("suffix") and scored:
        del body["echo"]  # prompt scoring of fill-in-the-middle tokens: refused
        scored = False
    if body.get("max_tokens") == 0 and not scored:
        body["max_tokens"] = 1  # nothing to generate is only asked when scoring the prompt
    if body.get("best_of") is not None:
        body["best_of"] = body.get("n") or 1
    prompts = body.get("prompt")
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], (str, list)):  # several prompts
        del prompts[max(1, MAX_REQUESTS // int(body.get("n") or 1)):]  # their choices within the server's limit
    for fields in (body, body.get("structured_outputs")):
        for name, grammar in VALID_GRAMMAR.items():
            if isinstance(fields, dict) and fields.get(name) is not None:
                fields[name] = grammar
    limit = next((body[k] for k in ("max_completion_tokens", "max_tokens", "n_predict") if body.get(k)), 16)
    if body.get("min_tokens") is not None:
        body["min_tokens"] = min(body["min_tokens"], limit if limit > 0 else 16)
    if isinstance(body.get("logit_bias"), dict):  # ids within the vocabulary
        body["logit_bias"] = {k: v for k, v in body["logit_bias"].items() if int(k) < N_VOCAB}
    if body.get("functions") is not None or body.get("function_call") is not None:  # the old form alone
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            body.pop(name, None)
    functions = [t.get("function", t) if isinstance(t, dict) else None for t in body.get("tools") or []]
    functions += body.get("functions") or []
    seen: dict = {}  # the names, in order
    for field in ("tools", "functions"):  # distinct names: the first function of each name stays
        kept = []
        for entry in body.get(field) or []:
            if _named(entry, field) not in seen:
                kept.append(entry)
                seen[_named(entry, field)] = None
        if kept:
            body[field] = kept
    for fn in functions:
        if isinstance(fn, dict) and "parameters" in fn:
            fn["parameters"] = ANY_OBJECT
    names = [name for name in seen if isinstance(name, str)]
    choice = body.get("tool_choice")
    if (isinstance(choice, dict) or choice == "required") and not names:
        body["tool_choice"] = "none"
    elif isinstance(choice, dict) or choice == "required":  # the first tool, as chat or the Responses API names it
        named = {"function": {"name": names[0]}} if "messages" in body else {"name": names[0]}
        body["tool_choice"] = {"type": "function", **named}
    if isinstance(body.get("function_call"), dict):
        body["function_call"] = {"name": names[0]} if names else "none"
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "function" and not message.get("name"):
            message["name"] = "f"  # a function's result names it
        if isinstance(message, dict) and message.get("function_call") is not None and message.get("tool_calls"):
            del message["function_call"]  # one form of a turn's calls
    if "input" in body:  # Responses: no stored response has a made-up id, and no two items share one
        body.pop("previous_response_id", None)
        if body.get("background"):  # stored, and polled rather than streamed
            body.pop("store", None)
            body.pop("stream", None)
        ids: set = set()
        for item in body["input"] if isinstance(body["input"], list) else ():
            if isinstance(item, dict) and item.get("id") is not None:
                if item["id"] in ids:
                    del item["id"]
                else:
                    ids.add(item["id"])
    if "input" in body and body.get("tools") and body.get("tool_choice") != "none":  # Responses: no logprobs with tools
        body.pop("top_logprobs", None)
        if isinstance(body.get("include"), list):
            body["include"] = [x for x in body["include"] if x != "message.output_text.logprobs"]
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict) and text["format"].get("schema") is not None:
        text["format"]["schema"] = ANY_OBJECT  # the Responses API's response_format
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("schema") is not None:
            fmt["schema"] = ANY_OBJECT
        if isinstance(fmt.get("json_schema"), dict) and fmt["json_schema"].get("schema") is not None:
            fmt["json_schema"]["schema"] = ANY_OBJECT


def _named(entry, field: str):
    """The function name of a ``tools`` or ``functions`` entry (None if it has none)."""
    fn = entry.get("function", entry) if field == "tools" and isinstance(entry, dict) else entry  # chat's or flat
    return fn.get("name") if isinstance(fn, dict) else None


def test_the_generated_requests_were_speculated(live_server) -> None:
    """Runs after the contract checks (same module): the draft proposed
    tokens and some were accepted, so the step ran with speculation."""
    text = httpx.get(live_server.url + "/metrics", timeout=10).text
    drafted = accepted = 0.0
    for line in text.splitlines():
        if line.startswith("specdec_drafted_tokens_total"):
            drafted = float(line.split()[-1])
        elif line.startswith("specdec_accepted_tokens_total"):
            accepted = float(line.split()[-1])
    assert drafted > 0 and accepted > 0, text

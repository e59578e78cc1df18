"""Grammar constraints (constraints/, engine/grammar_tokenizer.py) on the
tiny BPE and SentencePiece vocabularies and, marked ``real_model``, on
Qwen2.5-Coder's 152k vocabulary."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("llama_cpp")

from constraint_helpers import (  # noqa: E402
    allowed,
    consume_reference,
    expected_mask,
    finite_language_reference,
    forced_text,
    random_walk,
)

from specdec_cpu.constraints import (  # noqa: E402
    ConstraintState,
    Grammar,
    bitmask,
    compile_grammar,
    from_response_format,
)
from specdec_cpu.engine import (  # noqa: E402
    LlamaTokenizer,
    LlamaWeights,
    llg_tokenizer,  # noqa: E402
)
from specdec_cpu.errors import InvalidGrammarError, SpecDecError  # noqa: E402

WORDS = ["hello", "help", "world", "the world", "return 42", "print(hello)", "hell"]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 24},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "active"],
    "additionalProperties": False,
}


class Vocab:
    """A loaded model's grammar tokenizer and what the references need."""

    def __init__(self, path: str) -> None:
        self.weights = LlamaWeights(path)
        self.tok = LlamaTokenizer(self.weights)
        self.llg = llg_tokenizer(self.weights)
        self.n = self.weights.n_vocab
        self.pieces = [self.tok.token_bytes(t) for t in range(self.n)]
        self.special = {t for t in range(self.n) if self.llg.is_special_token(t)}
        self.eos = set(self.tok.eog_ids)

    def state(self, grammar: Grammar) -> ConstraintState:
        return compile_grammar(grammar, self.llg).new_state()

    def text(self, tokens) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)


@pytest.fixture(scope="module")
def bpe(tiny_target):
    v = Vocab(tiny_target)
    yield v
    v.weights.close()


@pytest.fixture(scope="module")
def spm(tiny_spm):
    v = Vocab(tiny_spm)
    yield v
    v.weights.close()


@pytest.fixture(scope="module")
def qwen():
    from real_models import default_pair

    _, draft = default_pair()  # same vocabulary as the target, a smaller file
    v = Vocab(draft)
    yield v
    v.weights.close()


# ---------------------------------------------------------------------------
# the tokenizer adapter
# ---------------------------------------------------------------------------


def test_tokenizer_covers_the_vocabulary(bpe):
    assert bpe.llg.vocab_size == bpe.n == 384
    assert sorted(bpe.llg.eos_tokens) == sorted(bpe.tok.eog_ids) == [311, 313]
    assert llg_tokenizer(bpe.weights) is bpe.llg  # cached per weights
    # control tokens are special (never matched by grammar text); the rest are text,
    # but for the byte 0xFF, which llguidance's marking of specials makes special too
    assert bpe.special == {t for t in range(bpe.n) if bpe.tok.token_text(t).startswith("<|")} | {255}
    assert bpe.llg.tokenize_str("hello world") == bpe.tok.tokenize("hello world", add_special=False)


def test_control_token_text_is_not_the_control_token(bpe):
    state = bpe.state(Grammar.lark('start: "<|im_start|>x"'))
    assert 312 not in allowed(state) and state.consume([312]) == 0
    assert bpe.text(state.forced_tokens()) == b"<|im_start|>x"


def test_a_cut_vocabulary_is_refused(bpe, monkeypatch):
    monkeypatch.setattr(type(bpe.weights), "source_ids", property(lambda self: np.arange(3)))
    with pytest.raises(ValueError, match="cut"):
        llg_tokenizer(bpe.weights)


# ---------------------------------------------------------------------------
# masks against the references
# ---------------------------------------------------------------------------


def _check_finite_language(v: Vocab, seed: int, walks: int) -> int:
    words = [w.encode() for w in WORDS]
    grammar = Grammar.regex("|".join(w.replace("(", r"\(").replace(")", r"\)") for w in WORDS))
    rng = random.Random(seed)
    checked = 0
    for _ in range(walks):
        state = v.state(grammar)
        prefix = b""
        while not state.ended:
            mask = allowed(state)
            ref = finite_language_reference(words, prefix, v.pieces, v.special, v.eos)
            forced = state.forced_tokens()
            if forced:
                # forced tokens only where the text is forced, and spelling it;
                # the mask is then narrowed to the first of them
                assert forced_text(words, prefix).startswith(v.text(forced)), (prefix, forced)
                assert mask == {forced[0]} and forced[0] in ref
            else:
                assert mask == ref, (prefix, sorted(mask ^ ref)[:10])
            assert (v.eos <= mask) == state.accepting == (prefix in words)
            t = rng.choice(sorted(mask))
            assert state.consume([t]) == 1
            prefix += b"" if t in v.eos else v.pieces[t]
            checked += 1
        assert prefix in words
    return checked


def test_masks_match_a_finite_language_reference_bpe(bpe):
    assert _check_finite_language(bpe, seed=0, walks=30) > 100


def test_masks_match_a_finite_language_reference_spm(spm):
    assert spm.n % 32 != 0  # the last word is partly past the vocabulary
    assert _check_finite_language(spm, seed=1, walks=20) > 60


@pytest.mark.parametrize("grammar", [
    Grammar.json_schema(PERSON),
    Grammar.json_schema(PERSON, layout="flexible"),
    Grammar.json_object(layout="compact"),
    Grammar.lark('start: item ("," item)*\nitem: /[a-z]{1,3}/ | NUMBER\nNUMBER: /[0-9]+/'),
], ids=["schema", "schema-flexible", "json-object", "lark"])
def test_masks_match_the_consume_reference_bpe(bpe, grammar):
    rng = random.Random(2)
    for _ in range(3):
        state = bpe.state(grammar)
        for _ in range(25):
            if state.ended:  # the sequence is over; the mask still says EOS
                assert allowed(state) == bpe.eos and consume_reference(state) == set()
                break
            ref = consume_reference(state)
            assert allowed(state) == expected_mask(state, ref)
            assert state.consume([rng.choice(sorted(allowed(state)))]) == 1


@pytest.mark.real_model
def test_masks_match_the_references_qwen(qwen):
    assert qwen.n == 151936
    assert _check_finite_language(qwen, seed=3, walks=4) > 10
    state = qwen.state(Grammar.json_schema(PERSON))
    rng = random.Random(4)
    for _ in range(6):
        assert allowed(state) == expected_mask(state, consume_reference(state))
        state.consume([rng.choice(sorted(allowed(state)))])


@pytest.mark.real_model
def test_qwen_tool_call_tag_is_its_own_token(qwen):
    """``<tool_call>`` is a user-defined token (151657): text to the grammar,
    so the tag in a grammar is matched by the token the model writes."""
    state = qwen.state(Grammar.lark('start: "<tool_call>\\n" /[a-z]+/'))
    assert allowed(state) == {151657} and state.forced_tokens() == [151657, 198]
    assert state.consume([151657, 198]) == 2


# ---------------------------------------------------------------------------
# consume and rollback
# ---------------------------------------------------------------------------


def test_consume_and_rollback_round_trip(bpe):
    state = bpe.state(Grammar.json_schema(PERSON))
    rng = random.Random(5)
    masks, path = [state.mask()], []
    for _ in range(40):
        t = rng.choice(sorted(allowed(state)))
        if t in bpe.eos:
            break
        assert state.consume([t]) == 1
        path.append(t)
        masks.append(state.mask())
    assert state.n_consumed == len(path)
    for back in (3, 1, 7, 0):
        state.rollback(back)
        np.testing.assert_array_equal(state.mask(), masks[state.n_consumed])
        assert state.consume(path[state.n_consumed:state.n_consumed + back]) == back
    state.keep(5)
    assert state.n_consumed == 5
    np.testing.assert_array_equal(state.mask(), masks[5])
    # a rejected token: the state advances over exactly the valid prefix
    bad = next(t for t in range(bpe.n) if state.copy().consume(path[5:8] + [t]) == 3)
    assert state.consume(path[5:8] + [bad] + path[8:9]) == 3
    np.testing.assert_array_equal(state.mask(), masks[8])
    assert state.n_consumed == 8
    with pytest.raises(ValueError, match="cannot roll back 9 tokens: 8 consumed"):
        state.rollback(9)
    np.testing.assert_array_equal(state.mask(), masks[8])  # still usable
    state.rollback(8)
    np.testing.assert_array_equal(state.mask(), masks[0])


def test_fill_masks_along_a_draft_leaves_the_state(bpe):
    state = bpe.state(Grammar.json_schema(PERSON))
    draft = bpe.tok.tokenize('{"name": "x", "age": 1', add_special=False)
    state.consume(draft[:2])
    out = bitmask.allocate(8, bpe.n)
    assert state.fill_masks(draft[2:5] + [bpe.tok.tokenize("}", add_special=False)[0], 0, 0], out) == 3
    assert state.n_consumed == 2
    walker = state.copy()
    for i, t in enumerate(draft[2:5]):
        np.testing.assert_array_equal(out[i], walker.mask())
        walker.consume([t])
    np.testing.assert_array_equal(out[3], walker.mask())
    assert not out[4:].any()


# ---------------------------------------------------------------------------
# forced tokens
# ---------------------------------------------------------------------------


def test_forced_tokens_of_fixed_keys(bpe):
    state = bpe.state(Grammar.json_schema(PERSON))
    forced = state.forced_tokens()
    assert bpe.text(forced) == b'{"name": "'
    assert state.forced_tokens(2) == forced[:2] and state.forced_tokens(0) == []
    assert state.n_consumed == 0 and state.forced_tokens() == forced  # not advanced
    assert state.consume(forced) == len(forced)
    assert state.consume(bpe.tok.tokenize('x"', add_special=False)) == 2
    assert bpe.text(state.forced_tokens()) == b', "age": '


def write_document(state: ConstraintState, v: Vocab, doc: bytes):
    """Decode ``doc`` as a model would under the constraint: forced tokens
    drafted for free, else the longest allowed token that ``doc`` continues
    with.  Returns (tokens, how many were forced)."""
    tokens, n_forced, pos = [], 0, 0
    while pos < len(doc):
        forced = state.forced_tokens()
        if forced:
            text = v.text(forced)
            assert doc.startswith(text, pos), (doc[pos:], text)
            step = forced
            n_forced += len(forced)
        else:
            fits = [t for t in allowed(state) if v.pieces[t] and doc.startswith(v.pieces[t], pos)]
            step = [max(fits, key=lambda t: len(v.pieces[t]))]
        assert state.consume(step) == len(step)
        tokens += step
        pos += len(v.text(step))
    assert state.accepting
    return tokens, n_forced


@pytest.mark.real_model
def test_fast_forward_share_of_a_compact_document(qwen):
    doc = {"name": "Augusta Ada King-Noel, Countess of Lovelace (born Byron)", "age": 36,
           "email": "ada.king-noel+notes@analytical-engine.example.org", "active": True}
    text = json.dumps(doc, separators=(",", ":")).encode()
    schema = dict(PERSON, properties=dict(PERSON["properties"], name={"type": "string"},
                                          email={"type": "string"}))
    state = qwen.state(Grammar.json_schema(schema, layout="compact"))
    tokens, n_forced = write_document(state, qwen, text)
    share = n_forced / len(tokens)
    print(f"fast-forward share: {n_forced}/{len(tokens)} tokens = {share:.0%} of a compact 4-field document")
    assert len(tokens) == 45
    # forced: '{"', 'name', 'age', '":', ',"', 'email', 'active', '}'; the
    # '":"' and '","' around strings are Qwen tokens that could also run on
    # into the string, so llguidance leaves them to the model
    assert n_forced == 8


# ---------------------------------------------------------------------------
# end of generation
# ---------------------------------------------------------------------------


def test_eos_allowed_exactly_where_the_grammar_accepts(bpe):
    rng = random.Random(6)
    eos = sorted(bpe.eos)
    state = bpe.state(Grammar.json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 4}))
    seen_accepting = 0
    for _ in range(60):
        mask = allowed(state)
        assert (set(eos) & mask == set(eos)) == state.accepting
        assert not (set(eos) & mask) or state.accepting
        if not state.accepting:
            assert state.copy().consume([eos[0]]) == 0
        else:
            seen_accepting += 1
            for e in eos:
                ended = state.copy()
                assert ended.consume([e, 48]) == 1 and ended.ended and ended.finished
                assert ended.consume([e]) == 0
                ended.rollback(1)
                assert not ended.ended and ended.accepting
        choices = sorted(mask - set(eos)) or eos
        state.consume([rng.choice(choices)])
        if state.ended:
            break
    assert seen_accepting


def test_eos_where_nothing_can_follow(bpe):
    """Where the grammar cannot be extended llguidance's mask allows only
    EOS but its matcher does not record consuming it: the state does."""
    state = bpe.state(Grammar.regex("abc"))
    assert state.consume(bpe.tok.tokenize("abc", add_special=False)) == 3
    assert state.finished and state.accepting and not state.ended
    assert allowed(state) == bpe.eos and state.forced_tokens() == []
    assert state.consume([313, 97]) == 1 and state.ended and state.n_consumed == 4
    assert state.consume([313]) == 0
    state.rollback(2)
    assert state.n_consumed == 2 and not state.finished
    assert allowed(state) == {99}


def test_end_of_generation_ids_read_as_text_only_end_a_complete_output(tiny_dir):
    """A model whose FIM tokens are end-of-generation ids stored as normal
    tokens, so plain text to the grammar (Qwen2.5-Coder's GGUF stores them
    as control tokens, which the grammar never allows): inside a JSON string
    llguidance's own mask allows them, as text that fits, while its matcher
    refuses them and emitting one would end the output mid-string.  The
    mask allows every EOS id exactly where the grammar accepts, as consume
    does (a disagreement once let the verify accept a draft token the
    grammar's state had refused, and failed the request)."""
    from tiny_gguf import write_tiny_model

    path = tiny_dir / "fim_eog.gguf"
    if not path.exists():
        write_tiny_model(path, n_vocab=384, seed=0, n_layer=2, fim=("pre", "suf", "mid", "pad", "rep", "sep"))
    v = Vocab(str(path))
    try:
        as_text = sorted(t for t in v.eos if t not in v.special)
        assert as_text, "the FIM end-of-generation ids must be text to the grammar, or this tests nothing"
        rng = random.Random(8)
        for grammar in (Grammar.json_schema({"type": "object"}), Grammar.json_schema(PERSON)):
            state = v.state(grammar)
            for text in ('{"name": "ab', '{"name": "a b c'):
                inside = v.state(grammar)
                assert inside.consume(v.tok.tokenize(text, add_special=False)) > 0
                assert not inside.accepting and not allowed(inside) & v.eos
            for _ in range(40):
                mask = allowed(state)
                for e in sorted(v.eos):
                    assert (e in mask) == (state.copy().consume([e]) == 1) == state.accepting
                if state.accepting:
                    break
                state.consume([rng.choice(sorted(mask))])
    finally:
        v.weights.close()

# ---------------------------------------------------------------------------
# grammars and errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("grammar, message", [
    (lambda: Grammar.json_schema({"type": "objekt"}), "invalid JSON schema: .*objekt"),
    (lambda: Grammar.json_schema('{"type": '), "not valid JSON"),
    (lambda: Grammar.json_schema([1, 2]), "must be an object"),
    (lambda: Grammar.json_schema({"type": "string", "format": "colour"}), "colour"),
    (lambda: Grammar.lark("start: missing_rule"), "invalid Lark grammar: .*missing_rule"),
    (lambda: Grammar.regex("a(b"), "invalid regex: .*unclosed group"),
    (lambda: Grammar.regex(""), "regex is empty"),
    (lambda: Grammar.gbnf('root ::= "a" nowhere'), "invalid GBNF grammar: .*nowhere"),
    (lambda: Grammar.json_schema(int), "pydantic"),
])
def test_invalid_grammars_are_refused_at_compile_time(bpe, grammar, message):
    """Raised by Grammar itself when no tokenizer is needed, else by compile_grammar."""
    with pytest.raises(InvalidGrammarError, match="(?s)" + message) as info:
        compile_grammar(grammar(), bpe.llg, param="response_format")
    assert isinstance(info.value, SpecDecError) and isinstance(info.value, ValueError)
    assert info.value.param in ("response_format", None)
    assert "<state>" not in str(info.value) and len(str(info.value)) < 700


def test_gbnf_and_lark_grammars(bpe):
    state = bpe.state(Grammar.gbnf('root ::= "yes" | "no"'))
    assert {bpe.pieces[t] for t in allowed(state)} == {b"y", b"n"}
    state.consume(bpe.tok.tokenize("no", add_special=False))
    assert state.finished


def test_pydantic_model_class(bpe):
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false
        x: int = pydantic.Field(ge=-50, le=50)
        y: int
        label: str = pydantic.Field(max_length=6)

    grammar = Grammar.json_schema(Point)
    assert json.loads(grammar.source)["required"] == ["x", "y", "label"]
    for seed in range(5):
        state = bpe.state(grammar)
        tokens = random_walk(state, random.Random(seed), 500)
        assert state.ended
        point = Point.model_validate_json(bpe.text(tokens[:-1]))
        assert -50 <= point.x <= 50 and len(point.label) <= 6


def test_response_format():
    assert from_response_format(None) is None and from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == Grammar.json_object()
    g = from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    assert g == Grammar.json_schema(PERSON)
    with pytest.raises(InvalidGrammarError) as info:
        from_response_format({"type": "json_schema", "json_schema": {"schema": "{oops"}})
    assert info.value.param == "response_format.json_schema.schema"
    with pytest.raises(InvalidGrammarError, match="type") as info:
        from_response_format({"type": "xml"})
    assert info.value.param == "response_format.type"


def test_compiled_grammars_are_cached(bpe, spm):
    a = compile_grammar(Grammar.json_schema(PERSON), bpe.llg)
    assert compile_grammar(Grammar.json_schema(json.dumps(PERSON)), bpe.llg) is a
    assert compile_grammar(Grammar.json_schema(PERSON, layout="compact"), bpe.llg) is not a
    assert compile_grammar(Grammar.json_schema(PERSON), spm.llg).n_vocab == spm.n


# ---------------------------------------------------------------------------
# the bitmask
# ---------------------------------------------------------------------------


def test_bitmask_layout(spm):
    ids = [0, 5, 31, 32, 33, 255, spm.n - 1]
    row = bitmask.from_ids(ids, spm.n)
    assert row.shape == (bitmask.n_words(spm.n),) == (10,)
    for t in ids:
        assert (int(row.view(np.uint32)[t >> 5]) >> (t & 31)) & 1
    assert bitmask.allowed_ids(row, spm.n).tolist() == ids
    # llguidance fills the same layout, into int32 or uint32 rows, no bit past the vocabulary
    state = spm.state(Grammar.json_object())
    for dtype in (np.int32, np.uint32):
        row = bitmask.allocate(1, spm.n, dtype)[0]
        row[:] = 0
        state.fill_mask(row)
        assert int(row.view(np.uint32)[-1]) >> (spm.n % 32) == 0
        assert set(bitmask.allowed_ids(row, spm.n).tolist()) == consume_reference(state) or state.forced_tokens()
    with pytest.raises(ValueError, match="shape"):
        state.fill_mask(np.zeros(3, dtype=np.int32))
    with pytest.raises(TypeError, match="int32 or uint32"):
        state.fill_mask(np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="contiguous"):
        state.fill_mask(np.zeros(20, dtype=np.int32)[::2])

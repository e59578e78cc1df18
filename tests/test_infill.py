"""Fill-in-the-middle prompts (core/infill.py) from a GGUF's FIM tokens."""

from __future__ import annotations

import pytest

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.errors import InfillUnsupportedError

ALL = ("pre", "suf", "mid", "pad", "rep", "sep")


@pytest.fixture(scope="module")
def fim_models(tiny_dir):
    from tiny_gguf import write_tiny_model

    paths = {}
    for name, fim in (("repo", ALL), ("plain", ("pre", "suf", "mid"))):
        path = tiny_dir / f"fim_{name}.gguf"
        if not path.exists():
            write_tiny_model(path, n_vocab=384, seed=0, fim=fim)
        paths[name] = str(path)
    return paths


def test_prompt_layout_with_and_without_repository_tokens(fim_models):
    extra = [{"filename": "a.py", "text": "import os"}, {"filename": "b.py", "text": "x = 1"}]
    with SpeculativeDecoder.from_gguf(fim_models["repo"], None, gamma=0, n_ctx=256, calibration=None) as dec:
        tok = dec.tokenizer
        pre, suf, mid, pad, rep, sep = range(384 - 6, 384)
        assert tok.fim_ids == dict(zip(ALL, range(384 - 6, 384)))

        def text(s: str) -> list:
            return tok.tokenize(s, add_special=False, parse_special=False)

        ids = dec.infill_prompt("def f(x):", "return y", extra)
        assert ids == ([tok.bos, rep] + text("project\n") + [sep] + text("a.py\nimport os") + [sep]
                       + text("b.py\nx = 1") + [pre] + text("def f(x):") + [suf] + text("return y") + [mid])
        gen = dec.generate(ids, max_tokens=8, params=SamplingParams(temperature=0.0))
        assert len(gen.tokens) > 0
    with SpeculativeDecoder.from_gguf(fim_models["plain"], None, gamma=0, n_ctx=256, calibration=None) as dec:
        pre, suf, mid = range(384 - 3, 384)
        ids = dec.infill_prompt("def f(x):", "", extra)
        text = dec.tokenizer.tokenize("import os\nx = 1\ndef f(x):", add_special=False, parse_special=False)
        assert ids == [dec.tokenizer.bos, pre] + text + [suf, mid]  # the files' texts lead the prefix


def test_a_model_without_fim_tokens_and_bad_extra_are_refused(tiny_target, fim_models):
    with SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=64, calibration=None) as dec:
        with pytest.raises(InfillUnsupportedError, match="no fill-in-the-middle tokens.*PRE, SUF, MID"):
            dec.infill_prompt("a", "b")
    with SpeculativeDecoder.from_gguf(fim_models["repo"], None, gamma=0, n_ctx=64, calibration=None) as dec:
        with pytest.raises(ValueError, match=r"extra\[1\] must be an object with a string 'text'"):
            dec.infill_prompt("a", "b", [{"text": "x"}, {"filename": "y"}])

"""Fill-in-the-middle prompts from a model's own FIM tokens.

A code model trained for infilling reads ``<PRE> prefix <SUF> suffix <MID>``
and writes the middle.  Context from other files (``extra``, as llama.cpp's
``/infill`` takes it) goes first, in the repository layout such models were
trained on where the vocabulary has the tokens for it (Qwen2.5-Coder:
``<|repo_name|>`` once, then ``<|file_sep|>name`` and the text per file);
without them the files' texts are prepended to the prefix.

The suffix and the extra context are part of the prompt, so prompt-lookup
drafting finds continuations in them as in the rest of the prompt.
"""

from __future__ import annotations

from typing import List, Mapping, Sequence

from ..errors import InfillUnsupportedError

__all__ = ["infill_tokens"]

#: The repository name written after ``<|repo_name|>`` (the models need a line there, not a real name).
REPO_NAME = "project"


def infill_tokens(tokenizer, prefix: str, suffix: str, extra: Sequence[Mapping[str, str]] = ()) -> List[int]:
    """The prompt ids for the middle between ``prefix`` and ``suffix``;
    ``extra`` is a list of ``{"filename": ..., "text": ...}`` (other files).

    Raises ``InfillUnsupportedError`` (a ValueError) for a model without
    FIM tokens, ``ValueError`` for a malformed ``extra`` entry."""
    fim = getattr(tokenizer, "fim_ids", None) or {}
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        raise InfillUnsupportedError(
            "the target model has no fill-in-the-middle tokens (it lacks FIM " + ", ".join(missing).upper() +
            " in its GGUF metadata): use a code model trained for infilling", param="suffix")
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("text"), str) or \
                not isinstance(chunk.get("filename", ""), str):
            raise ValueError(f"extra[{i}] must be an object with a string 'text' (and 'filename'), got {chunk!r}")

    def text(s: str) -> List[int]:
        return tokenizer.tokenize(s, add_special=False, parse_special=False) if s else []

    head: List[int] = []
    bos = getattr(tokenizer, "bos", None)
    if getattr(tokenizer, "add_bos", False) and bos is not None:
        head.append(bos)
    if extra and "rep" in fim and "sep" in fim:
        head += [fim["rep"]] + text(REPO_NAME + "\n")
        for chunk in extra:
            head += [fim["sep"]] + text(chunk.get("filename", "") + "\n" + chunk["text"])
    elif extra:
        prefix = "".join(chunk["text"] + "\n" for chunk in extra) + prefix
    return head + [fim["pre"]] + text(prefix) + [fim["suf"]] + text(suffix) + [fim["mid"]]

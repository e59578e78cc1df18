"""Hard-wrapped lines, joined: a second text for prompt lookup.

Documents pasted into prompts are often wrapped at a fixed width (e-mail,
text extracted from PDFs, RFCs, man pages).  A model quoting them joins the
lines: "run the motor for⏎five seconds" comes back as "run the motor for
five seconds".  The copy prompt lookup follows then breaks at every line end
of the source, and the match that picks it up again starts one token long,
too short to draft far on.  Looking up the joined lines as well lets a quote
be followed across the joins.
"""

from __future__ import annotations

from typing import Protocol, Sequence

__all__ = ["unwrapped_lines", "unwrapped_reference"]


class TextTokenizer(Protocol):
    """What unwrapping needs of a tokenizer (core.protocols.Tokenizer has it;
    drafters sit below core, so they name only these two methods)."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...


def unwrapped_lines(text: str) -> list[str]:
    """The runs of wrapped lines in ``text``, each joined into one line.

    A line continues the one before it when both start with text.  An
    indented line (code, a quoted block) starts with whitespace, a blank
    line ends a paragraph and Markdown code fences (``` or ~~~) hold code:
    their breaks are structure, not wrapping.  Lines that continue nothing and are continued
    by nothing are left out: the text already holds them as they are.
    """
    out: list[str] = []
    run: list[str] = []
    in_code = False
    for line in text.split("\n"):
        fence = line.lstrip().startswith(("```", "~~~"))
        in_code ^= fence
        if run and not (fence or in_code) and run[-1][:1].strip() and line[:1].strip():
            run.append(line)
            continue
        if len(run) > 1:
            out.append(" ".join(part.strip() for part in run))
        run = [] if fence or in_code else [line]
    if len(run) > 1:
        out.append(" ".join(part.strip() for part in run))
    return out


def unwrapped_reference(tokens: Sequence[int], tokenizer: TextTokenizer) -> list[list[int]]:
    """The unwrapped lines of the text ``tokens`` spell, as token ids: what
    :meth:`NgramDrafter.set_reference` takes."""
    text = b"".join(tokenizer.token_bytes(int(t)) for t in tokens).decode("utf-8", "replace")
    return [tokenizer.tokenize(line, add_special=False, parse_special=False)
            for line in unwrapped_lines(text)]

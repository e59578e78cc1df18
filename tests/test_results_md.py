"""bench/RESULTS.md is what its results files give: every section is
rendered by its study from the file under bench/results/ it names
(python -m bench.render), so a table edited by hand, or a results file
changed without its section, fails here."""

from __future__ import annotations

import difflib


def test_results_md_is_rendered_from_the_results_files():
    from bench import render

    have = render.RESULTS_MD.read_text()
    want = render.rendered()
    diff = "\n".join(list(difflib.unified_diff(have.splitlines(), want.splitlines(), "bench/RESULTS.md",
                                               "rendered", lineterm="", n=1))[:60])
    assert have == want, f"run python -m bench.render (and commit the result):\n{diff}"


def test_every_results_file_has_a_section_or_is_history():
    """A study's results file that no section renders is either kept as
    history (bench/results/history/) or the reduced audit run that the full
    one replaced; anything else is a results file nobody reads."""
    from bench.common import BENCH

    text = (BENCH / "RESULTS.md").read_text() + (BENCH / "HISTORY.md").read_text()
    orphans = [str(p.relative_to(BENCH)) for p in sorted((BENCH / "results").rglob("*.json"))
               if "history" not in p.parts and p.name not in text and p.parent.name not in text]
    assert orphans == [], orphans

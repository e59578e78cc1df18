"""bench/RESULTS.md is what its results files give: every section is
rendered by its study from the file under bench/results/ it names
(python -m bench.render), so a table edited by hand, or a results file
changed without its section, fails here."""

from __future__ import annotations


def test_results_md_is_rendered_from_the_results_files():
    from bench import render

    diff = render.difference(render.rendered())
    assert not diff, "run python -m bench.render (and commit the result):\n" + "\n".join(diff[:60])


def test_every_results_file_is_linked_or_is_history():
    """Every results file outside bench/results/history/ is named, by its path
    under bench/, in RESULTS.md or HISTORY.md; anything else is a file nobody reads."""
    from bench.common import BENCH

    text = (BENCH / "RESULTS.md").read_text() + (BENCH / "HISTORY.md").read_text()
    orphans = [path for path in (str(p.relative_to(BENCH)) for p in sorted((BENCH / "results").rglob("*.json")))
               if not path.startswith("results/history/") and path not in text]
    assert orphans == [], orphans

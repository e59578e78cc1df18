"""README.md stays true: its commands parse, its Python compiles against
the real API, its links resolve, and its results table is the one the
result files give (python -m bench.headline)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def shell_lines() -> list[str]:
    """The README's indented command lines (comments dropped)."""
    out = []
    for line in README.splitlines():
        if line.startswith("    ") and not line.startswith("     ") and line.strip():
            out.append(line.split("  #")[0].strip())
    return out


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_two_commands_come_first_and_name_real_extras():
    first, second = shell_lines()[:2]
    assert first.startswith("pip install '.[models]' && specdec-cpu generate")
    assert second == "pip install '.[test,models,server,ray]' && python -m pytest -q"
    extras = importlib.metadata.metadata("specdec-cpu").get_all("Provides-Extra") or []
    for line in shell_lines():
        for group in re.findall(r"'\.\[([a-z,]+)\]'", line):
            assert set(group.split(",")) <= set(extras), line
    # .ci/run runs the README's test command: the line its pattern picks is the second one
    picked = [m for m in (re.match(r"^ {4} *(pip install .*\[test.*pytest.*)$", x) for x in README.splitlines()) if m]
    assert picked[0].group(1) == second


@pytest.mark.parametrize("line", [x for x in shell_lines() if x.startswith("specdec-cpu ")])
def test_every_cli_command_parses(line):
    from specdec_cpu.cli import build_parser

    argv = shlex.split(line)[1:]
    args = build_parser().parse_args(argv)  # a usage error exits 2 and fails the test
    assert args.command == argv[0]


def test_the_plan_command_runs():
    line = next(x for x in shell_lines() if x.startswith("specdec-cpu plan "))
    out = subprocess.run([sys.executable, "-m", "specdec_cpu.cli", *shlex.split(line)[1:]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "γ" in out.stdout or "gamma" in out.stdout


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.split("\n")[0][:40])
def test_python_blocks_use_the_real_api(block):
    import specdec_cpu
    from specdec_cpu import DecoderSettings, SamplingParams, SpeculativeDecoder

    tree = ast.parse(block)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "specdec_cpu":
            for alias in node.names:
                assert hasattr(specdec_cpu, alias.name), alias.name
        if isinstance(node, ast.Call) and node.keywords:
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            kwargs = {k.arg for k in node.keywords if k.arg}
            if name == "SamplingParams":
                SamplingParams(**{k.arg: ast.literal_eval(k.value) for k in node.keywords})
            elif name == "from_gguf":
                allowed = {f.name for f in dataclasses.fields(DecoderSettings)} | {"settings", "progress"}
                assert kwargs <= allowed, (name, kwargs - allowed)
            elif name in ("generate", "stream") and "client" not in ast.unparse(node.func):
                params = inspect.signature(getattr(SpeculativeDecoder, name)).parameters
                assert kwargs <= set(params), (name, kwargs - set(params))
            elif name == "chat" and "client" not in ast.unparse(node.func):
                params = inspect.signature(SpeculativeDecoder.generate).parameters
                assert kwargs <= set(params), (name, kwargs - set(params))


def test_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_headline_table_matches_the_result_files():
    from bench import headline

    assert headline.START in README and headline.END in README
    assert headline.splice(README, headline.render()) == README, "run python -m bench.headline"


def test_headline_run_reruns_the_command_each_result_file_records(tmp_path):
    """``python -m bench.headline --run`` measures the table again: each result
    file's own recorded command is run (here commands that only leave a mark)."""
    import json

    from bench import headline

    for name, _ in headline.STUDIES:
        mark = tmp_path / (name.replace("/", "_") + ".ran")
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps({"command": f"python -c \"open({str(mark)!r}, 'w')\""}))
    headline.rerun(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.ran")) == sorted(
        n.replace("/", "_") + ".ran" for n, _ in headline.STUDIES)

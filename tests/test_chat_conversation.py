"""`/save FILE` and `/load FILE` in `specdec-cpu chat`, on a ChatSession over a
stand-in decoder (no model needed: only the conversation state is involved)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specdec_cpu.cli.chat import ChatSession
from specdec_cpu.params import SamplingParams


def session(drafter=True) -> ChatSession:
    decoder = SimpleNamespace(target_path="/m/t.gguf", draft_path="/m/d.gguf" if drafter else None,
                              has_drafter=drafter, ngram=False, gamma="auto", reset=lambda: None)
    return ChatSession(decoder, SamplingParams(temperature=0.7), 256, "auto", None)


def test_save_and_load_round_trip(tmp_path, capsys):
    a = session()
    a.system = "Be terse."
    a.history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    a.set_params(["temperature=0.3", "top_k=40", "seed=7", "gamma=3", "max_tokens=99"])
    path = tmp_path / "conv.json"
    assert a.handle(f"/save {path}")
    assert f"(saved 1 turns to {path})" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["format"] == "specdec-cpu-chat" and data["models"] == {"target": "t.gguf", "draft": "d.gguf"}
    assert data["messages"][0] == {"role": "system", "content": "Be terse."} and len(data["messages"]) == 3
    assert data["settings"]["temperature"] == 0.3 and data["settings"]["gamma"] == 3

    b = session()
    assert b.handle(f"/load {path}")
    assert b.system == "Be terse." and b.history == a.history
    assert b.settings() == a.settings()
    assert "(loaded 1 turns from" in capsys.readouterr().out
    assert [m["role"] for m in b.messages()] == ["system", "user", "assistant"]


def test_a_session_without_drafter_keeps_its_gamma(tmp_path, capsys):
    a = session()
    a.set_params(["gamma=4"])
    a.handle(f"/save {tmp_path / 'c.json'}")
    b = session(drafter=False)
    b.handle(f"/load {tmp_path / 'c.json'}")
    assert b.gamma == "auto"


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    ('{"messages": []}', "is not a conversation saved by /save"),
    ('{"format": "specdec-cpu-chat", "messages": [{"role": "wizard", "content": "x"}]}', "message 0"),
    ('{"format": "specdec-cpu-chat", "messages": [], "settings": {"temperature": -1}}', "temperature"),
])
def test_a_bad_file_changes_nothing(tmp_path, capsys, content, message):
    s = session()
    s.history = [{"role": "user", "content": "keep me"}, {"role": "assistant", "content": "ok"}]
    before = (list(s.history), s.settings())
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert s.handle(f"/load {bad}")
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and err.count("\n") == 1
    assert (s.history, s.settings()) == before
    s.handle(f"/load {tmp_path / 'missing.json'}")
    assert "cannot read" in capsys.readouterr().err
    s.handle("/save")
    assert "usage: /save FILE" in capsys.readouterr().err


def test_errors_name_what_the_user_gave(tmp_path, capsys):
    """/save into a missing folder names the file asked for (not a temporary one);
    /json with a schema whose regex does not parse shows where, not its first line only."""
    s = session()
    s.decoder.grammar_state = lambda grammar: grammar.check()
    s.handle(f"/save {tmp_path / 'missing' / 'chat.json'}")
    err = capsys.readouterr().err
    assert f"{tmp_path / 'missing' / 'chat.json'}" in err and ".tmp" not in err, err
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string", "pattern": "(abc"}}}))
    s.handle(f"/json {schema}")
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "unclosed group" in err, err
    assert s.grammar is None

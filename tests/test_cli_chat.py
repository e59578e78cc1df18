"""`specdec-cpu chat` driven in a real pseudo-terminal, as a user drives it."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

from model_stores import store_env  # noqa: E402

PROMPT = ">>> "
# The status line after every reply (stderr, the same terminal).
# Replies in which nothing was drafted say "plain decoding" instead of the
# acceptance, α, γ and speed-up figures.
STATUS = (r"\[(?P<tokens>\d+) tokens · (?P<tps>[\d.]+) tok/s · (?:acceptance (?P<acc>[\d.]+) · "
          r"mean α (?P<alpha>[\d.]+) · γ (?P<gamma>[\d.]+) · est\. (?P<speedup>[\d.]+)× over plain"
          r"|plain decoding)(?: · (?P<reason>[a-z ]+))?\]")
# A greedy reply of the tiny target to this message runs for thousands of
# tokens: long enough to be interrupted.
LONG = "tell me a long story"
TIMEOUT = 90


@pytest.fixture
def chat(tmp_path, tiny_target, tiny_draft):
    """Start `specdec-cpu chat` on the tiny pair; yields a function taking extra flags."""
    children = []

    def start(*flags: str, target: str = tiny_target, draft: str | None = tiny_draft,
              preexec_fn=None, term: str = "dumb"):
        env = dict(os.environ)
        env.update(store_env(tmp_path / "stores"))  # empty model stores: no draft found on the machine
        env.pop("NO_COLOR", None)
        env.update(SPECDEC_CACHE_DIR=str(tmp_path / "cache"), PYTHONIOENCODING="utf-8",
                   TERM=term, INPUTRC=os.devnull,
                   SPECDEC_CALIBRATION_DIR=str(tmp_path / "calibration"))
        env.pop("SPECDEC_DEBUG", None)
        argv = ["-m", "specdec_cpu.cli", "chat", "--target", target]
        if draft is not None:
            argv += ["--draft", draft]
        child = pexpect.spawn(sys.executable, argv + list(flags), env=env, encoding="utf-8",
                              codec_errors="replace", timeout=TIMEOUT, dimensions=(40, 200),
                              preexec_fn=preexec_fn)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)


def ready(child) -> None:
    child.expect_exact(PROMPT)


def say(child, text: str) -> "re.Match":
    """Send a message; return the status line's match once the reply is done."""
    child.sendline(text)
    child.expect(STATUS)
    match = child.match
    ready(child)
    return match


def test_reply_is_streamed_with_a_status_line(chat):
    child = chat("--max-tokens", "24", "--seed", "1", "--gamma", "2")
    child.expect("target.gguf, draft draft.gguf")
    child.expect("/help")
    ready(child)
    child.sendline("hello there")
    child.expect_exact("hello there")  # the terminal's echo of the line
    child.expect(STATUS)
    reply = child.before
    status = child.match
    assert reply.strip(), "no reply text before the status line"
    assert 1 <= int(status["tokens"]) <= 24
    assert float(status["tps"]) > 0
    assert 0 <= float(status["acc"]) <= 1 and 0 <= float(status["alpha"]) <= 1
    assert float(status["speedup"]) > 0
    ready(child)
    child.sendeof()  # Ctrl-D ends the session
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_later_turns_reuse_the_cache_and_stats(chat, tmp_path, tiny_target, tiny_draft):
    child = chat("--max-tokens", "16", "--seed", "2", "--gamma", "2")  # a fixed γ: drafting is asserted
    ready(child)
    say(child, "hello")
    child.sendline("/stats")
    child.expect(r"last reply:")
    child.expect(r"prompt: +(\d+) tokens, (\d+) reused from the cache")
    first_prompt, first_reused = int(child.match[1]), int(child.match[2])
    assert first_reused == 0
    child.expect(r"drafted/accepted: +\d+/\d+ \(acceptance [\d.]+\)")
    child.expect(r"mean α: +[\d.]+ over \d+ verified rows")
    child.expect(r"session \(1 replies, 1 turns in the conversation\)")
    child.expect(r"planner: the pair's α̂ [\d.]+, draft cost ĉ (?:[\d.]+|not measured), T\(1\) [\d.]+ ms")
    ready(child)
    say(child, "and the world")
    child.sendline("/stats")
    child.expect(r"last reply:")
    child.expect(r"prompt: +(\d+) tokens, (\d+) reused from the cache")
    prompt, reused = int(child.match[1]), int(child.match[2])
    # The second prompt holds the whole conversation; the first turn's part is reused.
    assert prompt > first_prompt and reused >= first_prompt - 1
    child.expect(r"session \(2 replies, 2 turns in the conversation\)")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_params_show_set_and_reject(chat):
    child = chat("--max-tokens", "8", "--temperature", "0.8")
    ready(child)
    child.sendline("/params")
    child.expect(r"temperature=0.8 top_k=0 top_p=1 min_p=0 seed=none max_tokens=8 gamma=auto")
    ready(child)
    child.sendline("/params temperature=0.7 top_p=0.9 top-k=40 gamma=2 seed=11")
    child.expect(r"temperature=0.7 top_k=40 top_p=0.9 min_p=0 seed=11 max_tokens=8 gamma=2")
    ready(child)
    child.sendline("/params top_p=1.5")
    child.expect(r"error: top_p must be in \(0, 1\]")
    ready(child)
    child.sendline("/params warmth=3")
    child.expect(r"error: unknown parameter 'warmth'; known: temperature, top_k")
    ready(child)
    child.sendline("/params temperature=hot")
    child.expect(r"error: bad value for temperature: 'hot'")
    ready(child)
    child.sendline("/params gamma=99")
    child.expect(r"error: bad value for gamma")
    ready(child)
    child.sendline("/params max_tokens=99999999999")
    child.expect(r"error: max_tokens must be in \[1, 16777216\] \(as --max-tokens\), got 99999999999")
    ready(child)
    child.sendline("/params temperature")
    child.expect(r"error: expected KEY=VALUE")
    ready(child)
    # A rejected /params changes nothing; the accepted one is used by the next reply.
    child.sendline("/params")
    child.expect(r"temperature=0.7 top_k=40 top_p=0.9 min_p=0 seed=11 max_tokens=8 gamma=2")
    ready(child)
    status = say(child, "hello")
    assert status["gamma"] is not None and float(status["gamma"]) <= 2.0
    assert int(status["tokens"]) <= 8
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_ctrl_c_stops_the_reply_and_keeps_the_session(chat):
    child = chat("--temperature", "0", "--max-tokens", "100000", "--ctx", "4096")
    ready(child)
    child.sendline(LONG)
    child.expect_exact(LONG)
    child.expect(r"\S")  # the reply has started streaming
    child.sendintr()
    child.expect(STATUS)
    status = child.match
    assert status["reason"] == "stopped", f"reply not interrupted: {status.group(0)}"
    assert int(status["tokens"]) < 3000
    ready(child)
    child.sendline("/stats")
    child.expect(r"tokens: +\d+ \(cancelled\)")
    child.expect(r"session \(1 replies, 1 turns in the conversation\)")  # partial reply kept
    ready(child)
    # The session goes on: a next reply works and reuses the cache.
    child.sendline("/params max_tokens=6")
    ready(child)
    status = say(child, "hello")
    assert int(status["tokens"]) <= 6
    child.sendline("/stats")
    child.expect(r"prompt: +\d+ tokens, [1-9]\d* reused from the cache")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_at_the_prompt_does_not_exit(chat):
    child = chat("--max-tokens", "4")
    ready(child)
    child.sendintr()
    child.expect(r"/exit or Ctrl-D quits")
    ready(child)
    assert child.isalive()
    status = say(child, "hello")
    assert int(status["tokens"]) <= 4
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_at_the_prompt_works_when_started_with_sigint_ignored(chat):
    """A non-interactive shell starts background jobs (`cmd &` in a script)
    with SIGINT ignored, and children inherit that: a test suite run that way
    once made Ctrl-C at the prompt do nothing.  The chat must not depend on
    the disposition it inherits."""
    child = chat("--max-tokens", "4", preexec_fn=_ignore_sigint)
    ready(child)
    child.sendintr()
    child.expect(r"/exit or Ctrl-D quits")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_system_reset_help_and_unknown_commands(chat):
    child = chat("--max-tokens", "4", "--system", "You are terse.")
    ready(child)
    child.sendline("/system")
    child.expect_exact("system prompt: 'You are terse.'")
    ready(child)
    child.sendline("/system Answer in French.")
    child.expect_exact("(system prompt set)")
    ready(child)
    child.sendline("/system")
    child.expect_exact("system prompt: 'Answer in French.'")
    ready(child)
    say(child, "hello")
    child.sendline("/reset")
    child.expect_exact("(conversation cleared)")
    ready(child)
    child.sendline("/stats")
    child.expect(r"0 turns in the conversation")
    ready(child)
    say(child, "hello")
    child.sendline("/stats")
    # After /reset the prompt is processed from scratch.
    child.expect(r"prompt: +\d+ tokens, 0 reused from the cache")
    ready(child)
    child.sendline("/help")
    child.expect(r"/params KEY=VALUE")
    child.expect(r"Ctrl-C stops a reply")
    ready(child)
    child.sendline("/frobnicate")
    child.expect(r"unknown command /frobnicate; /help lists the commands")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_plain_decoding_without_draft(chat):
    child = chat("--max-tokens", "6", "--no-auto-draft", draft=None)
    child.expect("no draft: plain decoding")
    ready(child)
    child.sendline("hello")
    child.expect(r"\[\d+ tokens · [\d.]+ tok/s · plain decoding")
    ready(child)
    child.sendline("/params gamma=3")
    child.expect("needs a drafter")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_model_without_chat_template_is_one_line(chat, tiny_no_template):
    child = chat("--no-auto-draft", target=tiny_no_template, draft=None)
    child.expect(r"error: the target model has no chat template .*generate --raw")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_missing_model_is_one_line(chat, tmp_path):
    child = chat(target=str(tmp_path / "missing.gguf"), draft=None)
    child.expect(r"error: --target \S+missing.gguf: no such file")
    assert child.before.strip() == "specdec-cpu:"  # nothing printed before the one line
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_an_invalid_start_up_grammar_stops_before_the_models_load(chat, tmp_path):
    (tmp_path / "bogus.json").write_text('{"type": "bogus"}')
    child = chat("--json-schema", str(tmp_path / "bogus.json"), target=str(tmp_path / "missing.gguf"), draft=None)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert child.before.strip() == "specdec-cpu chat: error: --json-schema: invalid JSON schema: Invalid type: bogus"


def test_json_mode_constrains_the_replies(chat, tmp_path):
    """/json on: the reply is one JSON object; /json FILE: it matches the
    schema; /json off: free text again; a bad file is one line, the mode kept."""
    import json as _json

    schema = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]}}, "required": ["animal"],
              "additionalProperties": False}
    (tmp_path / "s.json").write_text(_json.dumps(schema))
    child = chat("--max-tokens", "60", "--seed", "3", "--gamma", "2")
    ready(child)
    child.sendline("/json")
    child.expect_exact("replies are free text")
    ready(child)
    child.sendline(f"/json {tmp_path / 's.json'}")
    child.expect_exact("(replies follow a JSON schema)")
    ready(child)
    child.sendline("pick an animal")
    child.expect_exact("pick an animal")
    child.expect(STATUS)
    assert _json.loads(child.before.strip()) in ({"animal": "cat"}, {"animal": "dog"})
    ready(child)
    child.sendline(f"/json {tmp_path / 'missing.json'}")
    child.expect("error: /json: cannot read")
    ready(child)
    child.sendline("/json")
    child.expect_exact("replies follow a JSON schema")
    ready(child)
    child.sendline("/json off")
    child.expect_exact("(replies are free text)")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_a_reasoning_model_s_thinking_is_dimmed_and_kept_apart(chat, tmp_path):
    """On a colour terminal a <think> block is dimmed and set off from the answer; the conversation keeps
    the answer as the turn's content and the thinking as its reasoning_content (/save), and /load keeps
    them.  On a plain terminal the reply is written as the model gave it.  (A grammar makes the tiny model
    think, then answer.)"""
    import json as _json

    from tiny_gguf import write_tiny_model

    tags = ("<think>", "</think>")
    target = write_tiny_model(tmp_path / "think.gguf", n_vocab=384, seed=0, n_layer=2, user_tokens=tags)
    draft = write_tiny_model(tmp_path / "think_draft.gguf", n_vocab=384, seed=0, n_layer=2, noise=0.04,
                             noise_seed=7, user_tokens=tags)
    (tmp_path / "think.gbnf").write_text('root ::= "<think>" [a-z]{1,12} "</think>" " " [a-z]{1,12}\n')
    flags = ("--max-tokens", "60", "--seed", "1", "--gamma", "2", "--grammar", str(tmp_path / "think.gbnf"))
    child = chat(*flags, target=str(target), draft=str(draft), term="xterm")
    ready(child)
    child.sendline("think, then answer")
    child.expect_exact("think, then answer")
    child.expect(STATUS)
    shown = re.search(r"\x1b\[2m([a-z]+)\x1b\[0m\r?\n\r?\n([a-z]+)", child.before)
    assert shown, repr(child.before)
    ready(child)
    child.sendline(f"/save {tmp_path / 'talk.json'}")
    ready(child)
    saved = _json.loads((tmp_path / "talk.json").read_text())["messages"]
    assert saved[-1] == {"role": "assistant", "content": shown[2], "reasoning_content": shown[1]}
    child.sendline(f"/load {tmp_path / 'talk.json'}")
    ready(child)
    child.sendline(f"/save {tmp_path / 'again.json'}")
    ready(child)
    assert _json.loads((tmp_path / "again.json").read_text())["messages"] == saved
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    plain = chat(*flags, target=str(target), draft=str(draft))
    ready(plain)
    plain.sendline("think, then answer")
    plain.expect_exact("think, then answer")
    plain.expect(STATUS)
    assert re.search(r"<think>[a-z]+</think> [a-z]+", plain.before) and "\x1b[" not in plain.before
    plain.sendline("/exit")
    plain.expect(pexpect.EOF)

"""``specdec-cpu chat``: an interactive, multi-turn conversation in the terminal.

Each turn sends the whole conversation through the target's chat template;
the decoder finds the common prefix with what its KV caches already hold, so a
later turn only processes the new message.  Line editing and history come
from the standard library's ``readline`` where it is available.

Ctrl-C during a reply stops it after the step in progress.  The partial reply
is kept in the conversation (it is what the user saw, and the caches already
hold it); a reply stopped before its first token drops the whole turn, so the
message can simply be sent again.  Ctrl-C at the prompt drops the line being
typed and shows a hint; Ctrl-D or ``/exit`` ends the session.  At other moments
(a command running) Ctrl-C is ignored; ``_interrupts`` explains why the
session installs its own handler for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from ..chat.reasoning import has_thinking_tags, opens_thinking
from ..core.stats import GenerationStats
from ..errors import SpecDecError
from ..params import SamplingParams
from ._common import UsageError, emit
from ._constraint import add_constraint_args, constraint_from_args, schema_file
from ._conversation import load_conversation, save_conversation
from ._discovery import label
from ._interrupts import PromptInterrupts
from ._session import (
    MAX_TOKENS_LIMIT,
    PARAM_KEYS,
    add_model_args,
    add_sampling_args,
    check_args,
    combine,
    describe_models,
    estimated_speedup,
    gamma_value,
    has_drafter,
    interruptible,
    load_decoder,
    run_result,
    sampling_params,
    setup_stdout,
    stats_lines,
    status_line,
)
from ._thinking import ReplyPrinter, colour_terminal

DEFAULT_MAX_TOKENS = 1024
PROMPT = ">>> "
CONTINUATION = "... "

HELP = """\
Type a message and press Enter; end a line with \\ to continue it on the next line.
Commands:
  /stats                      statistics of the last reply and of the session
  /params                     show the sampling parameters
  /params KEY=VALUE ...       change them, e.g. /params temperature=0.7 top_p=0.9
                              keys: temperature, top_k, top_p, min_p, max_tokens,
                              gamma (auto or N), seed (every reply restarts its random
                              streams from it, and repeats at a fixed gamma; with auto
                              the gamma chosen varies; none = one stream for the session)
  /system TEXT                set the system prompt (/system alone shows it, /system - clears it)
  /json on | FILE | off       replies as one JSON object (on), as JSON matching the schema
                              in FILE, or free text again (off); /json alone shows the mode
  /save FILE                  save the conversation and the parameters (JSON)
  /load FILE                  continue a saved conversation, with its parameters
  /reset                      forget the conversation (and the model's cache of it)
  /help                       this help
  /exit                       quit (also Ctrl-D)
Ctrl-C stops a reply in progress; the partial reply stays in the conversation.
A message that starts with / is sent as text when written with //."""

_ALIASES = {"temp": "temperature", "t": "temperature", "k": "top_k", "p": "top_p",
            "max": "max_tokens", "n": "max_tokens", "g": "gamma"}


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``chat`` subcommand."""
    p = sub.add_parser(
        "chat",
        help="chat with the model in the terminal (multi-turn, streamed)",
        description="An interactive conversation using the target model's chat template, with "
                    "streamed replies and a status line after each (tokens/s, acceptance, "
                    "mean α, γ, estimated speed-up over plain decoding). Type /help inside "
                    "for the commands. Without --target/--draft the bundled demo pair is used.",
    )
    add_model_args(p)
    add_sampling_args(p, DEFAULT_MAX_TOKENS)
    add_constraint_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the models and run the conversation loop until /exit or EOF."""
    setup_stdout()
    params = sampling_params(args)
    check_args(args)
    grammar = constraint_from_args(args)
    err = sys.stderr
    decoder = load_decoder(args, announce=err)
    try:
        decoder.chat_prompt([{"role": "user", "content": "hi"}])
    except ValueError:
        raise ValueError(f"the target model has no chat template ({decoder.target_path}); "
                         "use `specdec-cpu generate --raw` with it instead") from None
    session = ChatSession(decoder, params, args.max_tokens, args.gamma, args.system, grammar)
    emit(f"{describe_models(decoder)}. /help for commands, Ctrl-D or /exit to quit.", err)
    history = _History()
    try:
        session.loop()
    finally:
        history.save()
    return 0


class ChatSession:
    """The conversation state and the command handlers."""

    def __init__(self, decoder, params: SamplingParams, max_tokens: int, gamma: Any,
                 system: Optional[str], grammar: Any = None) -> None:
        self.decoder = decoder
        self.grammar = grammar  # a constraints.Grammar every reply follows, or None
        self.params = params
        self.max_tokens = max_tokens
        self.gamma = gamma
        self.system = system
        self.history: list[dict] = []
        self.last: Optional[GenerationStats] = None
        self.last_speedup: Optional[float] = None
        self.session_stats: list[GenerationStats] = []
        self.interactive = bool(getattr(sys.stdin, "isatty", lambda: False)())

    # ------------------------------------------------------------ input
    def loop(self) -> None:
        """Read and act on inputs until /exit or end of input."""
        with PromptInterrupts() as interrupts:
            self._loop(interrupts)

    def _loop(self, interrupts: PromptInterrupts) -> None:
        while True:
            try:
                with interrupts.reading():
                    line = self._read()
            except EOFError:
                if self.interactive:
                    sys.stdout.write("\n")
                return
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                emit("(Ctrl-C stops a reply in progress; /exit or Ctrl-D quits)", sys.stderr)
                continue
            if line is None:
                continue
            if not self.handle(line):
                return

    def _read(self) -> Optional[str]:
        prompt = PROMPT if self.interactive else ""
        lines = []
        while True:
            line = input(prompt)
            if line.endswith("\\"):
                lines.append(line[:-1])
                prompt = CONTINUATION if self.interactive else ""
                continue
            lines.append(line)
            break
        text = "\n".join(lines)
        return text if text.strip() else None

    def handle(self, line: str) -> bool:
        """Act on one input; False ends the session."""
        stripped = line.strip()
        if stripped.startswith("//"):
            self.reply(stripped[1:])
            return True
        if stripped.startswith("/"):
            name, _, rest = stripped[1:].partition(" ")
            return self.command(name.lower(), rest.strip())
        self.reply(line)
        return True

    # ------------------------------------------------------------ commands
    def command(self, name: str, rest: str) -> bool:
        if name in ("exit", "quit", "q", "bye"):
            return False
        if name in ("help", "h", "?"):
            emit(HELP)
        elif name == "stats":
            emit("\n".join(self.stats_text()))
        elif name == "reset":
            self.history.clear()
            self.decoder.reset()
            emit("(conversation cleared)")
        elif name == "params":
            if rest:
                try:
                    self.set_params(rest.split())
                except ValueError as exc:
                    emit(f"error: {exc}", sys.stderr)
                    return True
            emit(self.params_text())
        elif name == "system":
            if not rest:
                emit(f"system prompt: {self.system!r}" if self.system is not None
                     else "no system prompt")
            elif rest == "-":
                self.system = None
                emit("(system prompt cleared)")
            else:
                self.system = rest
                emit("(system prompt set)")
        elif name == "json":
            self.json_mode(rest)
        elif name in ("save", "load"):
            if not rest:
                emit(f"usage: /{name} FILE", sys.stderr)
            else:
                try:
                    if name == "save":
                        self.save(rest)
                    else:
                        self.load(rest)
                except (OSError, ValueError) as exc:
                    emit(f"error: {_first_line(exc)}", sys.stderr)
        else:
            emit(f"unknown command /{name}; /help lists the commands", sys.stderr)
        return True

    def json_mode(self, rest: str) -> None:
        """``/json``: show the mode; ``/json`` on, with a schema FILE, or off."""
        from ..constraints import Grammar
        from ..constraints.grammar import first_lines

        if not rest:
            emit(f"replies follow a {self.grammar.what}" if self.grammar is not None else "replies are free text")
            return
        if rest.lower() == "off":
            self.grammar = None
            emit("(replies are free text)")
            return
        try:
            grammar = Grammar.json_object() if rest.lower() == "on" else schema_file(rest, "/json")
            self.decoder.grammar_state(grammar)  # checked now, not at the next reply
        except (UsageError, ValueError) as exc:  # all of it: a schema's regex error shows where, below its first line
            emit(f"error: {first_lines(str(exc))}", sys.stderr)
            return
        self.grammar = grammar
        emit(f"(replies follow a {grammar.what})")

    def save(self, path: str) -> None:
        """Write the conversation and the settings to ``path`` (JSON)."""
        models = {"target": label(self.decoder.target_path),
                  "draft": label(self.decoder.draft_path) if self.decoder.draft_path else None}
        dst = save_conversation(path, self.system, self.history, self.settings(), models)
        emit(f"(saved {len(self.history) // 2} turns to {dst})")

    def load(self, path: str) -> None:
        """Continue the conversation saved in ``path``, with its settings (all or nothing)."""
        system, history, settings = load_conversation(path)
        items = [f"{k}={'none' if v is None else v}" for k, v in settings.items() if k in PARAM_KEYS]
        if isinstance(settings.get("gamma"), int) and settings["gamma"] > 0 and not has_drafter(self.decoder):
            items = [i for i in items if not i.startswith("gamma=")]  # this session cannot draft
        self.set_params(items)
        self.system, self.history = system, history
        emit(f"(loaded {len(history) // 2} turns from {path}; {self.params_text()})")

    def settings(self) -> dict:
        p = self.params
        return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                "min_p": p.min_p, "seed": p.seed, "max_tokens": self.max_tokens,
                "gamma": self.gamma}

    def params_text(self) -> str:
        def show(v: Any) -> str:
            return "none" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))

        return " ".join(f"{k}={show(v)}" for k, v in self.settings().items())

    def set_params(self, items: list[str]) -> None:
        """Apply ``key=value`` items all at once, or none of them (ValueError says why)."""
        new = self.settings()
        for item in items:
            key, eq, value = item.partition("=")
            key = key.strip().lower().replace("-", "_")
            key = _ALIASES.get(key, key)
            if not eq or not value.strip():
                raise ValueError(f"expected KEY=VALUE, got {item!r}")
            if key not in PARAM_KEYS:
                raise ValueError(f"unknown parameter {key!r}; known: {', '.join(PARAM_KEYS)}")
            new[key] = _parse_value(key, value.strip())
        if not 1 <= new["max_tokens"] <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS_LIMIT}] (as --max-tokens), "
                             f"got {new['max_tokens']}")
        if isinstance(new["gamma"], int) and new["gamma"] > 0 and not has_drafter(self.decoder):
            raise ValueError(f"gamma={new['gamma']} needs a drafter; this session has none "
                             "(start with --draft or --ngram)")
        try:
            params = SamplingParams(temperature=new["temperature"], top_k=new["top_k"], top_p=new["top_p"],
                                    min_p=new["min_p"], seed=new["seed"], ignore_eos=self.params.ignore_eos)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        self.params, self.max_tokens, self.gamma = params, new["max_tokens"], new["gamma"]

    # ------------------------------------------------------------ replies
    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + self.history

    def reply(self, text: str) -> None:
        """Stream the model's answer to ``text``; print the status line."""
        messages = self.messages() + [{"role": "user", "content": text}]
        out = sys.stdout
        # A template that opens a thinking block leaves the reply inside it, unless a grammar shapes it all.
        thinks = has_thinking_tags(self.decoder.tokenizer)
        inside = thinks and self.grammar is None and opens_thinking(self.decoder.chat_prompt(messages))
        printer = ReplyPrinter(out, thinks=thinks, inside=inside, colour=colour_terminal(out))
        try:
            with interruptible() as cancel:
                stream = self.decoder.chat_stream(messages, max_tokens=self.max_tokens,
                                                  params=self.params, gamma=self.gamma,
                                                  cancel=cancel, grammar=self.grammar)
                try:
                    for piece in stream:
                        printer.write(piece)
                        if cancel.is_set():
                            break
                finally:
                    stream.close()
                    printer.finish()
        except KeyboardInterrupt:
            # A second Ctrl-C before the decoder reached a step boundary: the
            # stream is closed (its caches resynchronised); start the next
            # turn from a clean cache to be safe and drop this turn.
            out.write("\n")
            self.decoder.reset()
            emit("(reply interrupted; the turn was dropped)", sys.stderr)
            return
        except (SpecDecError, ValueError) as exc:
            emit(f"error: {_first_line(exc)}", sys.stderr)
            if "context" in str(exc):
                emit("(/reset starts a new conversation; --ctx raises the context size)", sys.stderr)
            return
        if printer.last and printer.last != "\n":
            out.write("\n")
            out.flush()
        gen = run_result(stream)
        stats = gen.stats
        if gen.text or stats.finish_reason != "cancelled":
            self.history += [{"role": "user", "content": text}, printer.message(gen.text)]
        self.last = stats
        self.session_stats.append(stats)
        self.last_speedup = estimated_speedup(self.decoder, stats, self.gamma)
        emit(status_line(stats, self.last_speedup, stats.drafted > 0), sys.stderr)
        if stats.finish_reason == "context":
            emit("(the context is full: /reset starts a new conversation; --ctx raises the size)",
                 sys.stderr)

    def stats_text(self) -> list[str]:
        if self.last is None:
            return ["no reply yet"]
        lines = ["last reply:"] + ["  " + s for s in stats_lines(self.last, self.last_speedup,
                                                                 self.last.drafted > 0)]
        total = combine(self.session_stats)
        drafting = total.drafted > 0
        lines += [
            f"session ({len(self.session_stats)} replies, {len(self.history) // 2} turns in the "
            f"conversation):",
            f"  tokens:            {total.tokens}, {total.tokens_per_second:.1f} tok/s over "
            f"{total.decode_seconds:.1f} s of decoding",
        ]
        if drafting:
            lines += [
                f"  acceptance:        {total.acceptance:.3f} ({total.accepted}/{total.drafted})",
                f"  mean α:            {total.mean_alpha:.3f}",
                f"  mean γ:            {total.mean_gamma:.2f}",
            ]
        if drafting:
            est = self.decoder.policy.estimates()
            cost = f"{est['cost']:.3f}" if est["cost"] is not None else "not measured"
            lines.append(f"  planner: the pair's α̂ {est['alpha']:.3f}, draft cost ĉ {cost}, "
                         f"T(1) {est['target_ms'][0]:.1f} ms")
        lines.append(f"  {describe_models(self.decoder)}")
        return lines


def _parse_value(key: str, value: str) -> Any:
    try:
        if key == "gamma":
            try:
                return gamma_value(value)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(str(exc)) from None
        if key == "seed":
            if value.lower() in ("none", "off", "random"):
                return None
            seed = int(value)
            if seed < 0:
                raise ValueError
            return seed
        if key in ("top_k", "max_tokens"):
            return int(value)
        result = float(value)
    except ValueError as exc:
        detail = f": {exc}" if str(exc) else ""
        kind = {"gamma": "'auto' or an integer", "seed": "an integer >= 0 or none",
                "top_k": "an integer", "max_tokens": "an integer"}.get(key, "a number")
        raise ValueError(f"bad value for {key}: {value!r} (expected {kind}){detail}") from None
    try:  # range checks with SamplingParams' own messages
        if key == "temperature":
            SamplingParams(temperature=result)
        elif key == "top_p":
            SamplingParams(top_p=result)
        elif key == "min_p":
            SamplingParams(min_p=result)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


class _History:
    """readline line editing, with the input history kept across sessions."""

    def __init__(self) -> None:
        self.path = None
        self.readline = None
        if not getattr(sys.stdin, "isatty", lambda: False)():
            return
        try:
            import readline
        except ImportError:  # pragma: no cover - e.g. Windows without pyreadline
            return
        self.readline = readline
        from ..paths import cache_dir

        self.path = cache_dir() / "chat_history"
        try:
            readline.read_history_file(self.path)
        except (OSError, ValueError):
            pass
        readline.set_history_length(1000)

    def save(self) -> None:
        if self.readline is None or self.path is None:
            return
        try:
            os.makedirs(self.path.parent, exist_ok=True)
            self.readline.write_history_file(self.path)
        except OSError:
            pass

"""``specdec-cpu generate PROMPT``: one completion, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from ._common import UsageError, emit
from ._constraint import add_constraint_args, constraint_from_args
from ._session import (
    add_model_args,
    add_sampling_args,
    check_args,
    describe_models,
    estimated_speedup,
    interruptible,
    load_decoder,
    run_result,
    sampling_params,
    setup_stdout,
    stats_lines,
    status_line,
)

DEFAULT_MAX_TOKENS = 256


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``generate`` subcommand."""
    p = sub.add_parser(
        "generate",
        help="generate one completion of a prompt (streamed to stdout)",
        description="Generate a completion of PROMPT by exact speculative decoding and stream "
                    "it to stdout; statistics go to stderr (--stats) or, with --json, into one "
                    "JSON object on stdout. Without --target/--draft the bundled demo pair is "
                    "used (prepared on first use, see `specdec-cpu models`).",
    )
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; '-' reads it from stdin")
    add_model_args(p)
    add_sampling_args(p, DEFAULT_MAX_TOKENS)
    add_constraint_args(p)
    fmt = p.add_argument_group("prompt format and output")
    mode = fmt.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="template", action="store_const", const=True, default=None,
                      help="wrap the prompt in the model's chat template (the default when the "
                           "model has one)")
    mode.add_argument("--raw", dest="template", action="store_const", const=False,
                      help="use the prompt as it is, without the chat template")
    fmt.add_argument("--stats", action="store_true", help="print generation statistics to stderr")
    fmt.add_argument("--json", action="store_true",
                     help="print the text and the statistics as one JSON object on stdout "
                          "instead of streaming")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate, stream, report."""
    setup_stdout()
    params = sampling_params(args)
    check_args(args)
    prompt = _read_prompt(args.prompt)
    grammar = constraint_from_args(args)

    decoder = load_decoder(args)
    text, chat = _prompt_text(decoder, prompt, args)

    pieces_out = not args.json
    last = ""
    with interruptible() as cancel:
        stream = decoder.stream(text, max_tokens=args.max_tokens, params=params, cancel=cancel, grammar=grammar)
        try:  # a broken pipe (`| head`) ends the command quietly: see main()
            for piece in stream:
                if pieces_out:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                    last = piece or last
                if cancel.is_set():
                    break
        finally:
            stream.close()

    gen = run_result(stream)
    stats = gen.stats
    drafting = stats.drafted > 0
    speedup = estimated_speedup(decoder, stats, decoder.gamma)
    if args.json:
        emit(json.dumps(_json(decoder, args, params, gen, chat, speedup, grammar)))
    elif last and not last.endswith("\n"):
        sys.stdout.write("\n")
        sys.stdout.flush()
    if args.stats:
        lines = [describe_models(decoder), *stats_lines(stats, speedup, drafting),
                 status_line(stats, speedup, drafting)]
        emit("\n".join(lines), sys.stderr)
    if cancel.is_set():
        emit("interrupted", sys.stderr)
        return 130
    return 0


def _read_prompt(arg: str) -> str:
    if arg == "-":
        if sys.stdin is None:
            raise UsageError("PROMPT is '-' but there is no standard input")
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise UsageError(f"PROMPT '-': standard input is not UTF-8 text ({exc.reason} at byte {exc.start})") \
                from None
        text = text[:-1] if text.endswith("\n") else text  # the newline echo/heredocs add
    else:
        text = arg
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def _prompt_text(decoder, prompt: str, args: argparse.Namespace) -> "tuple[str, bool]":
    """The text to decode and whether the chat template was applied."""
    if args.template is False:
        if args.system is not None:
            emit("warning: --system is ignored with --raw", sys.stderr)
        return prompt, False
    messages = []
    if args.system is not None:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": prompt})
    try:
        return decoder.chat_prompt(messages), True
    except ValueError:
        if args.template is True:
            raise ValueError("--chat: the target model has no chat template (use --raw)") from None
    if args.system is not None:
        emit("warning: --system is ignored: the target model has no chat template", sys.stderr)
    return prompt, False


def _json(decoder, args: argparse.Namespace, params, gen, chat: bool,
          speedup: Optional[float], grammar) -> dict:
    return {
        "text": gen.text,
        "constraint": grammar.what if grammar is not None else None,
        "tokens": list(gen.tokens),
        "finish_reason": gen.finish_reason,
        "chat_template": chat,
        "target": decoder.target_path,
        "draft": decoder.draft_path,
        "ngram": bool(args.ngram),
        "params": {
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "seed": args.seed, "max_tokens": args.max_tokens,
            "ignore_eos": params.ignore_eos, "gamma": decoder.gamma,
        },
        "estimated_speedup": speedup,
        "stats": gen.stats.to_dict(),
    }

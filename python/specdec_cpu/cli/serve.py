"""``specdec-cpu serve``: an OpenAI-compatible HTTP server over a BatchedDecoder."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional

from ..chat.reasoning import REASONING_FORMATS
from ..settings import BatchedSettings, add_flags, from_flags
from ._common import UsageError, emit, int_in, positive_float
from ._discovery import add_discovery_args, check_model_files, finish_models, label, served_name

API_KEY_ENV = "SPECDEC_API_KEY"
CORS_ENV = "SPECDEC_CORS_ORIGIN"


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``serve`` subcommand."""
    p = sub.add_parser(
        "serve",
        help="serve the model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions)",
        description="An OpenAI-compatible HTTP server: every request's rows share the model's passes "
                    "(BatchedDecoder). Without TARGET the bundled demo pair is served. Needs the "
                    "[server] extra (pip install 'specdec-cpu[server]').",
    )
    p.add_argument("target", nargs="?", metavar="TARGET",
                   help="target model: a GGUF file or a model's name (see `specdec-cpu models`); "
                        "default: the demo pair")
    p.add_argument("draft", nargs="?", metavar="DRAFT",
                   help="draft model sharing the target's vocabulary; default: the smallest such model "
                        "found on this machine, else n-gram drafting")
    # The other commands name the models with flags: accept them here too (else argparse
    # reads "--target" as an abbreviation of --target-ongoing).
    p.add_argument("--target", dest="target_flag", metavar="T.gguf|NAME", help="the same as TARGET")
    p.add_argument("--draft", dest="draft_flag", metavar="D.gguf|NAME", help="the same as DRAFT")
    add_discovery_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int_in(0, 65535), default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model id clients use (default: the target file's name)")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                   help="longest a request may take, waiting included (default 600 s)")
    p.add_argument("--max-body", type=int_in(1024, 1 << 30), default=1 << 20, metavar="BYTES",
                   help="largest request body accepted; larger gets 413 (default 1 MiB)")
    p.add_argument("--grace", type=positive_float, default=30.0, metavar="S",
                   help="on SIGTERM/SIGINT, time requests in flight get to finish (default 30 s)")
    p.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN", dest="cors_origin",
                   help="let web pages from ORIGIN call the API (CORS; repeat for more, '*' for any); "
                        f"default: ${CORS_ENV} (comma-separated), else CORS off")
    p.add_argument("--stored-responses", type=int_in(0, 1 << 20), default=256, metavar="N",
                   help="Responses API: keep the last N responses in memory, for previous_response_id and "
                        "GET /v1/responses/{id} (default 256; 0 keeps none)")
    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                   help="a reasoning model's <think> block: 'auto' (or 'deepseek', llama-server's name) answers it "
                        "as message.reasoning_content, apart from the content; 'none' leaves it in the content "
                        "(default auto; a request's reasoning_format overrides it)")
    p.add_argument("--log-prompts", action="store_true",
                   help="include prompts and outputs in the per-request log lines (off by default)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_flags(p.add_argument_group("the decoder (a request may set its own 'gamma')"), BatchedSettings)
    r = p.add_argument_group("Ray Serve (the [ray] extra): several replicas, on one or more machines")
    r.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: one BatchedDecoder per replica behind Ray Serve's HTTP ingress")
    r.add_argument("--replicas", type=int_in(1, 4096), default=1, metavar="N",
                   help="replicas (default 1); each gets --threads CPUs")
    r.add_argument("--min-replicas", type=int_in(1, 4096), default=None, metavar="N",
                   help="autoscale between --min-replicas and --max-replicas instead of a fixed number")
    r.add_argument("--max-replicas", type=int_in(1, 4096), default=None, metavar="N")
    r.add_argument("--target-ongoing", type=positive_float, default=4.0, metavar="R",
                   help="autoscaling target of ongoing requests per replica (default 4)")
    r.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"), metavar="ADDR",
                   help="an existing Ray cluster (default: $RAY_ADDRESS, else a local one is started)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the server; returns when it has shut down."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError("serving needs the [server] extra: pip install 'specdec-cpu[server]'") from None
    for flag, name in (("target", "TARGET"), ("draft", "DRAFT")):
        given = getattr(args, f"{flag}_flag")
        if given is not None and getattr(args, flag) is not None:
            raise UsageError(f"give the {flag} model once: as {name} or as --{flag}, not both")
        setattr(args, flag, getattr(args, flag) if given is None else given)
    if args.draft is not None and args.target is None:
        raise UsageError("--draft needs a target: give TARGET (or --target)")
    if args.draft_vocab is not None and args.target is not None and args.draft is None:
        raise UsageError("--draft-vocab cuts the draft model: give DRAFT")
    check_model_files([("--embedding-model", args.embedding_model, args.embedding_model)])
    target, draft = _model_paths(args)  # may pick a draft, or fall back on prompt lookup
    try:
        settings = from_flags(args, BatchedSettings)
        settings.check_drafter(draft is not None)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    name = args.model_name or served_name(target)
    if args.ray:
        return _run_ray(args, settings, target, draft, name)
    from ..decoding.batched import BatchedDecoder
    from ..server.http_server import listen, run_server
    from ..server.openai_app import ServerOptions

    def load() -> BatchedDecoder:
        return BatchedDecoder.from_gguf(target, draft, settings=settings, progress=lambda line: emit(line))

    options = ServerOptions(model_name=name, api_key=args.api_key or None, max_body_bytes=args.max_body,
                            request_timeout=args.timeout, log_prompts=args.log_prompts,
                            cors_origins=cors_origins(args), stored_responses=args.stored_responses,
                            reasoning_format=args.reasoning_format)
    listener = listen(args.host, args.port)  # a port in use stops here, before the model loads
    emit(f"serving {name} on http://{args.host}:{args.port} (OpenAI API under /v1; /health, /metrics); "
         f"loading {label(target)}" + (f" + {label(draft)}" if draft else "") + " ...")
    return run_server(load, options, host=args.host, port=args.port, grace=args.grace,
                      log_level=args.log_level, listener=listener)


def cors_origins(args: argparse.Namespace) -> "tuple[str, ...]":
    """The CORS origins of ``--cors-origin`` (or the environment's list)."""
    given = args.cors_origin
    if given is None:
        given = [o for o in os.environ.get(CORS_ENV, "").split(",")]
    origins = tuple(o.strip().rstrip("/") for o in given if o.strip())
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise UsageError(f"--cors-origin {origin!r}: an origin is '*' or scheme://host[:port], "
                             "e.g. http://localhost:3000")
    return origins


def _model_paths(args: argparse.Namespace) -> "tuple[str, Optional[str]]":
    if args.target is None:
        from ..demo_models import ensure_default_pair

        target, draft = ensure_default_pair(progress=True)
        return finish_models(args, str(target), str(draft), n_ctx=args.n_ctx, n_seq=args.max_sequences,
                             named=False)
    flags = ("--target" if args.target_flag else "TARGET", "--draft" if args.draft_flag else "DRAFT")
    return finish_models(args, args.target, args.draft, flags=flags, n_ctx=args.n_ctx, n_seq=args.max_sequences)


def _run_ray(args: argparse.Namespace, settings: BatchedSettings, target: str, draft: Optional[str],
             name: str) -> int:
    try:
        from ..server.ray_deployment import RayServeConfig, run_ray
    except ImportError:
        raise UsageError("--ray needs the [ray] extra: pip install 'specdec-cpu[ray]'") from None
    replicas = args.max_replicas or args.replicas
    threads = settings.n_threads or max(1, (os.cpu_count() or 1) // replicas)
    try:
        config = RayServeConfig(
            target=str(Path(target).resolve()), draft=str(Path(draft).resolve()) if draft else None,
            ngram=settings.ngram, draft_vocab=settings.draft_vocab, model_name=name, replicas=args.replicas,
            min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing, threads=threads, max_sequences=settings.max_sequences,
            max_queue=settings.max_queue, n_ctx=settings.n_ctx, gamma=settings.gamma,
            prefill_chunk=settings.prefill_chunk, api_key=args.api_key or None, max_body_bytes=args.max_body,
            request_timeout=args.timeout, log_prompts=args.log_prompts, cors_origins=cors_origins(args),
            stored_responses=args.stored_responses, reasoning_format=args.reasoning_format,
            chat_template=_template_text(settings.chat_template),
            embedding_model=str(Path(settings.embedding_model).resolve()) if settings.embedding_model else None,
            embedding_max_tokens=settings.embedding_max_tokens)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return run_ray(config, host=args.host, port=args.port, address=args.ray_address, say=emit)


def _template_text(spec: Optional[str]) -> Optional[str]:
    """A ``--chat-template`` as its text: replicas may run on nodes without the file."""
    if spec is None:
        return None
    from ..chat import load_template_source

    return load_template_source(spec)[0]

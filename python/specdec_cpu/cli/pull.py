"""``specdec-cpu pull REPO[:FILE]``: download a GGUF model from the Hugging Face hub."""

from __future__ import annotations

import argparse
import sys

from ._common import UsageError, emit


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``pull`` subcommand."""
    p = sub.add_parser(
        "pull",
        help="download a GGUF model from the Hugging Face hub (needs the [hub] extra)",
        description="Download a GGUF file of a Hugging Face repository into the Hugging Face "
                    "cache ($HF_HUB_CACHE), where `specdec-cpu models` finds it; afterwards "
                    "ORG/REPO:FILE names it wherever a model file is accepted. REPO alone takes "
                    "its Q4_K_M file (or asks which), REPO:TAG the file whose name carries TAG. "
                    "Needs the [hub] extra: pip install 'specdec-cpu[hub]'.",
    )
    p.add_argument("spec", metavar="ORG/REPO[:FILE|:TAG]",
                   help="e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Download, then say how to use the model."""
    from ..discovery import pull as hub_pull
    from ..discovery.shards import other_parts
    from ..discovery.units import format_bytes
    from ..errors import PullError

    try:
        hub_pull.import_hub()
    except PullError as exc:
        raise UsageError(str(exc)) from None
    name, path = hub_pull.pull(args.spec, say=lambda line: emit(line, sys.stderr))
    size = sum(p.stat().st_size for p in (path, *other_parts(path)) if p.exists())
    emit(f"{name}: {format_bytes(size)} at {path}")
    emit(f"use it as: specdec-cpu chat --target {name}")
    return 0


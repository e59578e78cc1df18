"""Models pulled with ollama.

ollama keeps them under ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (and,
for its Linux system service, ``/usr/share/ollama/.ollama/models``)::

    manifests/<registry>/<namespace>/<model>/<tag>   JSON: {"layers": [{"mediaType", "digest"}, ...]}
    blobs/sha256-<hex>                               content-addressed files

The layer of media type ``application/vnd.ollama.image.model`` is the GGUF
file.  Models are named as ollama names them: ``qwen2.5-coder:7b`` for its
own library, ``namespace/model:tag`` for other namespaces of its registry and
``host/namespace/model:tag`` for other registries (``hf.co/org/repo:Q4_K_M``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator, List

from .entry import ModelEntry

__all__ = ["default_roots", "scan", "ollama_name", "MODEL_MEDIA_TYPE"]

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")


def default_roots() -> List[Path]:
    """``$OLLAMA_MODELS`` alone when set, else ollama's default locations."""
    explicit = os.environ.get("OLLAMA_MODELS")
    if explicit:
        return [Path(explicit).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The short name ollama shows for a manifest's path."""
    if registry == DEFAULT_REGISTRY:
        return f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def _model_blob(root: Path, manifest: Path, name: str) -> "tuple[Path, str | None]":
    """The blob a manifest names as its model, and what is wrong, if anything."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except OSError as exc:
        return manifest, f"cannot read its manifest {manifest}: {exc.strerror or exc}"
    except ValueError as exc:
        return manifest, f"corrupt manifest {manifest} (not JSON: {exc})"
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return manifest, f"corrupt manifest {manifest} (no list of layers)"
    models = [layer for layer in layers
              if isinstance(layer, dict) and layer.get("mediaType") == MODEL_MEDIA_TYPE]
    if not models:
        return manifest, f"its manifest {manifest} has no GGUF model layer ({MODEL_MEDIA_TYPE})"
    digest = models[0].get("digest")
    match = _DIGEST.match(digest) if isinstance(digest, str) else None
    if match is None:
        return manifest, f"corrupt manifest {manifest} (model layer digest {digest!r})"
    hex_digest = match.group(1)
    for blob_name in (f"sha256-{hex_digest}", f"sha256:{hex_digest}"):  # the latter: old ollama versions
        blob = root / "blobs" / blob_name
        try:
            if blob.is_file():
                return blob, None
        except OSError as exc:  # blobs this user may not read
            return blob, f"cannot read its model blob {blob}: {exc.strerror or exc}"
    blob = root / "blobs" / f"sha256-{hex_digest}"
    return blob, f"its model blob {blob} is missing (`ollama pull {name}` fetches it again)"


def scan(root: Path) -> Iterator[ModelEntry]:
    """Every manifest under ``root/manifests``, as a model entry."""
    manifests = root / "manifests"
    try:
        if not manifests.is_dir():
            return
    except OSError:  # not readable by this user: nothing to list
        return
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(manifests).parts
        if len(rel) != 3:
            continue
        registry, namespace, model = rel
        for tag in sorted(f for f in filenames if not f.startswith(".")):
            name = ollama_name(registry, namespace, model, tag)
            path, problem = _model_blob(root, Path(dirpath) / tag, name)
            full = f"{registry}/{namespace}/{model}:{tag}"
            aliases = {full, f"{namespace}/{model}:{tag}"} - {name}
            if tag == "latest":
                aliases.add(name[: -len(":latest")])
            group = name.rsplit(":", 1)[0]
            yield ModelEntry(name=name, source="ollama", path=path, group=group,
                             aliases=tuple(sorted(aliases)), problem=problem, root=root)

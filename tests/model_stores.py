"""Fake model stores in temporary folders, laid out as ollama, the Hugging Face
hub cache and LM Studio lay out theirs, for the discovery tests.

``isolated_stores`` points every variable discovery reads (and ``HOME``) at
empty folders under a test's temporary directory, so a test never sees the
models of the machine it runs on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"


def store_env(tmp: Path) -> Dict[str, str]:
    """Variables for a process whose stores are all under ``tmp`` (created empty)."""
    dirs = {"OLLAMA_MODELS": tmp / "ollama", "HF_HUB_CACHE": tmp / "hf" / "hub",
            "SPECDEC_LMSTUDIO_DIR": tmp / "lmstudio", "HOME": tmp / "home"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: str(v) for k, v in dirs.items()}
    env["SPECDEC_MODEL_DIRS"] = ""
    return env


def isolated_stores(monkeypatch, tmp: Path) -> Dict[str, Path]:
    """Apply :func:`store_env` to this process (and a private cache); returns the folders."""
    env = store_env(tmp)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp / "cache"))
    return {k: Path(v) for k, v in env.items() if v}


def _split_ollama(name: str) -> "tuple[str, str, str, str]":
    base, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    parts = base.split("/")
    if len(parts) == 1:
        return "registry.ollama.ai", "library", parts[0], tag
    if len(parts) == 2:
        return "registry.ollama.ai", parts[0], parts[1], tag
    return parts[0], "/".join(parts[1:-1]), parts[-1], tag


def add_ollama_model(root: Path, name: str, gguf: PathLike, *, extra_layers: bool = True) -> Path:
    """Store ``gguf`` in ollama's layout under ``name`` (``model:tag``,
    ``ns/model:tag``, ``host/ns/model:tag``); returns the blob's path."""
    data = Path(gguf).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    layers = [{"mediaType": MODEL_MEDIA_TYPE, "digest": f"sha256:{digest}", "size": len(data)}]
    if extra_layers:
        template = b"{{ .Prompt }}"
        t_digest = hashlib.sha256(template).hexdigest()
        (root / "blobs" / f"sha256-{t_digest}").write_bytes(template)
        layers.append({"mediaType": "application/vnd.ollama.image.template",
                       "digest": f"sha256:{t_digest}", "size": len(template)})
    registry, namespace, model, tag = _split_ollama(name)
    manifest = root / "manifests" / registry / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": layers}))
    return blob


def ollama_manifest(root: Path, name: str) -> Path:
    registry, namespace, model, tag = _split_ollama(name)
    return root / "manifests" / registry / namespace / model / tag


def add_hub_file(cache: Path, repo: str, rel: str, gguf: Optional[PathLike], *,
                 revision: str = "a" * 40, main: bool = True) -> Path:
    """Store ``gguf`` as ``huggingface_hub`` does: a blob and a snapshot link
    (relative, into ``../../blobs``); ``gguf=None`` leaves the link dangling.
    Returns the snapshot path."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    data = Path(gguf).read_bytes() if gguf is not None else b"missing:" + rel.encode()
    etag = hashlib.sha256(data).hexdigest()
    blob = repo_dir / "blobs" / etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    if gguf is not None:
        blob.write_bytes(data)
    link = repo_dir / "snapshots" / revision / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)
    return link


def add_file(root: Path, rel: str, gguf: PathLike) -> Path:
    """Copy ``gguf`` to ``root/rel`` (LM Studio and model folders)."""
    dst = root / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, dst)
    return dst

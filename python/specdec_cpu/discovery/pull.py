"""Downloading a GGUF model from the Hugging Face hub (``specdec-cpu pull``).

Through ``huggingface_hub`` (the optional ``hub`` extra, imported only here),
into its cache, where discovery finds the model as ``org/repo:file.gguf``.
``REPO:FILE.gguf`` downloads that file (all parts of a split file);
``REPO:TAG`` the file whose name carries the tag (``Q4_K_M``); ``REPO``
alone lists the repository and takes its Q4_K_M file (else the first of
:data:`PREFERRED` it has), or asks for a choice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional, Tuple

from ..errors import PullError
from .resolve import tag_matches
from .shards import split_name

__all__ = ["HUB_EXTRA", "PREFERRED", "parse_spec", "choose_file", "pull", "import_hub"]

HUB_EXTRA = "pip install 'specdec-cpu[hub]'"

#: Quantisations taken, in this order, when only a repository is named.
PREFERRED = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q4_0", "IQ4_XS", "Q5_K_S", "Q6_K", "Q8_0")

_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/", "hf:")


def import_hub():
    """The ``huggingface_hub`` module, or PullError naming the extra."""
    try:
        import huggingface_hub
    except ImportError:
        raise PullError(f"downloading needs the 'hub' extra (huggingface_hub): {HUB_EXTRA}") from None
    return huggingface_hub


def parse_spec(spec: str) -> Tuple[str, Optional[str]]:
    """``"org/repo:file.gguf"`` -> ``("org/repo", "file.gguf")``; ``"org/repo"`` -> ``("org/repo", None)``."""
    text = spec.strip()
    for prefix in _PREFIXES:
        if text.lower().startswith(prefix):
            text = text[len(prefix):]
            break
    repo, _, wanted = text.partition(":")
    repo = repo.strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise PullError(f"{spec}: expected a Hugging Face repository as ORG/REPO[:FILE], "
                        "e.g. Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:qwen2.5-coder-7b-instruct-q4_k_m.gguf")
    return repo, (wanted or None)


def _models(files: List[str]) -> List[str]:
    """GGUF files of a listing, split files by their first part, projectors left out."""
    out = []
    for f in files:
        name = f.rsplit("/", 1)[-1].lower()
        if not name.endswith(".gguf") or name.startswith("mmproj"):
            continue
        split = split_name(f.rsplit("/", 1)[-1])
        if split is None or split[1] == 1:
            out.append(f)
    return sorted(out)


def choose_file(repo: str, files: List[str], wanted: Optional[str]) -> str:
    """The file to download among a repository's ``files`` (PullError when
    nothing fits or a choice is needed: the message lists the files)."""
    models = _models(files)
    if not models:
        raise PullError(f"{repo} has no GGUF files")
    listing = ", ".join(m for m in models[:12]) + (", ..." if len(models) > 12 else "")
    if wanted is not None:
        exact = [m for m in models if m.lower() == wanted.lower() or m.rsplit("/", 1)[-1].lower() == wanted.lower()]
        tagged = exact or [m for m in models if tag_matches(m.rsplit("/", 1)[-1], wanted)]
        if len(tagged) == 1:
            return tagged[0]
        if tagged:
            raise PullError(f"{repo}:{wanted} matches {len(tagged)} files ({', '.join(tagged)}); name one")
        raise PullError(f"{repo} has no GGUF file {wanted!r}; its GGUF files: {listing}")
    if len(models) == 1:
        return models[0]
    for tag in PREFERRED:
        tagged = [m for m in models if tag_matches(m.rsplit("/", 1)[-1], tag)]
        if len(tagged) == 1:
            return tagged[0]
        if tagged:  # not a larger file behind the user's back: the choice is theirs
            raise PullError(f"{repo} has {len(tagged)} {tag} GGUF files; choose one with "
                            f"`specdec-cpu pull {repo}:FILE`, FILE one of: {', '.join(tagged)}")
    raise PullError(f"{repo} has {len(models)} GGUF files; choose one with "
                    f"`specdec-cpu pull {repo}:FILE`, FILE one of: {listing}")


def _describe_failure(repo: str, what: str, exc: BaseException) -> str:
    names = {cls.__name__ for cls in type(exc).__mro__}
    detail = (str(exc) or type(exc).__name__).strip().splitlines()[0][:200]
    if "GatedRepoError" in names:
        return f"{repo} is gated: accept its terms on huggingface.co and log in (HF_TOKEN)"
    if "RepositoryNotFoundError" in names:
        return (f"{repo}: no such repository on the Hugging Face hub (a private one needs a "
                "login: HF_TOKEN)")
    # before EntryNotFoundError: huggingface_hub's LocalEntryNotFoundError (offline, not cached) derives from it
    if names & {"OfflineModeIsEnabled", "LocalEntryNotFoundError"}:
        return (f"cannot download {repo}{what and ':' + what}: offline (HF_HUB_OFFLINE is set, or the hub "
                f"is unreachable) and it is not in the cache ({detail})")
    if names & {"EntryNotFoundError", "RemoteEntryNotFoundError"}:
        return f"{repo} has no file {what}"
    if names & {"ConnectionError", "TimeoutError", "Timeout", "ConnectError", "TimeoutException",
                "HTTPError", "HfHubHTTPError", "TransportError", "RequestException", "NetworkError"}:
        return f"cannot reach the Hugging Face hub for {repo}: {detail}; check the network connection"
    if isinstance(exc, OSError) and exc.errno is not None:  # e.g. a full disk
        return f"downloading {repo}{what and ':' + what} failed: {detail}"
    return f"downloading {repo}{what and ':' + what} failed: {type(exc).__name__}: {detail}"


def pull(spec: str, say: Optional[Callable[[str], None]] = None) -> Tuple[str, Path]:
    """Download ``spec`` (``ORG/REPO[:FILE|:TAG]``) into the Hugging Face cache.

    Returns ``(name, path)``: the model's name for ``--target`` and the
    local file (the first part of a split file).  Raises PullError with one
    line naming the cause (missing extra, offline, no such repository or file).
    """
    hub = import_hub()
    repo, wanted = parse_spec(spec)
    if wanted is not None and wanted.lower().endswith(".gguf"):
        chosen = wanted  # no listing needed: works offline for a file already cached
    else:
        try:
            files = list(hub.list_repo_files(repo))
        except Exception as exc:  # noqa: BLE001 - the hub's errors vary between versions
            raise PullError(_describe_failure(repo, "", exc)) from None
        chosen = choose_file(repo, files, wanted)
        if say is not None:
            say(f"{repo}: downloading {chosen}")
    split = split_name(chosen.rsplit("/", 1)[-1])
    files_to_get = [chosen]
    if split is not None:
        stem, _, count = split
        folder = chosen[: len(chosen) - len(chosen.rsplit("/", 1)[-1])]
        files_to_get = [f"{folder}{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    paths = []
    for f in files_to_get:
        try:
            paths.append(Path(hub.hf_hub_download(repo_id=repo, filename=f)))
        except Exception as exc:  # noqa: BLE001
            raise PullError(_describe_failure(repo, f, exc)) from None
    return f"{repo}:{files_to_get[0]}", paths[0]  # a split file is named by its first part, as discovery lists it

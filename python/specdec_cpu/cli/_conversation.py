"""A chat conversation on disk: ``/save FILE`` and ``/load FILE``.

The file is JSON: ``{"format": "specdec-cpu-chat", "version": 1, "messages":
[{"role", "content"}, ...], "settings": {...}, "models": {...}}``; the
messages are in OpenAI's chat format (a system prompt first, if any; a
reasoning model's thinking as an assistant turn's ``reasoning_content``), the
settings are ``/params``' keys, ``models`` says which models wrote it (for
the reader; loading does not change the models).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..paths import atomic_path

__all__ = ["FORMAT", "save_conversation", "load_conversation"]

FORMAT = "specdec-cpu-chat"
_ROLES = ("system", "user", "assistant")


def save_conversation(path: str, system: Optional[str], history: List[dict], settings: Dict[str, Any],
                      models: Dict[str, Optional[str]]) -> Path:
    """Write the conversation to ``path`` (atomically); returns the file written."""
    dst = Path(path).expanduser()
    messages = ([{"role": "system", "content": system}] if system is not None else []) + list(history)
    data = {"format": FORMAT, "version": 1, "messages": messages, "settings": settings, "models": models}
    with atomic_path(dst) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return dst


def load_conversation(path: str) -> Tuple[Optional[str], List[dict], Dict[str, Any]]:
    """``(system prompt, messages after it, settings)`` from a saved file.

    Raises ValueError with one line saying what is wrong with the file.
    """
    src = Path(path).expanduser()
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {src}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{src} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{src} is not a conversation saved by /save")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ValueError(f"{src}: 'messages' must be a list")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str)
                or (m["role"] == "system" and i > 0)):
            raise ValueError(f"{src}: message {i} is not a {{role, content}} of a user, the assistant "
                             "or (first only) the system")
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    history = [{"role": m["role"], "content": m["content"],
                **({"reasoning_content": m["reasoning_content"]} if isinstance(m.get("reasoning_content"), str)
                   and m["role"] == "assistant" else {})}
               for m in messages[1 if system is not None else 0:]]
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{src}: 'settings' must be an object")
    return system, history, settings

"""The bodies the server answers with: a whole completion, or its stream of
server-sent events, with tool calls parsed out of chat output.

Ids are random (``chatcmpl-`` / ``cmpl-`` and 24 hex digits: unique across
restarts and Ray replicas); ``system_fingerprint`` names the served
configuration (the package's version, the model files and the decoder's
settings).  ``usage`` carries OpenAI's counts, ``prompt_tokens_details``
with the prompt tokens reused from the cache, and a ``speculation``
extension object: what llama-server reports in its ``timings``.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import secrets
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from ..chat import ReasoningSplitter, ToolCallStreamParser
from ..core.stats import Generation
from .structured import OutputSpec

__all__ = ["Reply", "new_request_id", "system_fingerprint", "usage", "finish_reason", "message_of",
           "StreamShaper", "LogprobFormatter"]

#: What a log-probability of -inf (a token outside the sampling distribution's
#: support) is reported as: JSON has no infinity (vLLM reports the same).
NEG_INF_LOGPROB = -9999.0


def new_request_id(chat: bool) -> str:
    """A random id, OpenAI's prefix."""
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def system_fingerprint(dec: Any) -> str:
    """``fp_`` and 12 hex digits of what decides the outputs' distribution
    and speed: the version, the model files (name and size), the settings."""
    from .. import __version__

    parts = [f"specdec-cpu {__version__}"]
    for path in (getattr(dec, "target_path", None), getattr(dec, "draft_path", None)):
        if path:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = -1
            parts.append(f"{os.path.basename(path)}:{size}")
    parts.append(f"gamma={getattr(dec, 'gamma', None)} ngram={getattr(dec, 'ngram', None)} "
                 f"n_ctx={getattr(dec, 'n_ctx', None)} template={getattr(dec, 'chat_template', None)}")
    return "fp_" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def usage(prompt_tokens: int, gen: Union[Generation, Sequence[Generation], None], per_prompt: int = 1,
          reasoning_tokens: Optional[int] = None) -> Dict[str, Any]:
    """OpenAI's usage, the cached prompt tokens, and the speculation statistics
    (of one generation, or summed over the choices: ``per_prompt`` choices of
    each prompt in turn, each prompt counted once); ``reasoning_tokens``: of
    a reasoning model's thinking, when it is answered apart."""
    gens: List[Generation] = [] if gen is None else [gen] if isinstance(gen, Generation) else list(gen)
    n = sum(len(g.tokens) for g in gens)
    cached = sum(g.stats.prompt_cached for g in gens[::per_prompt])
    out: Dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                           "total_tokens": prompt_tokens + n, "prompt_tokens_details": {"cached_tokens": cached}}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    if len(gens) == 1:
        s = gens[0].stats
        out["speculation"] = {
            "drafted": s.drafted, "accepted": s.accepted, "acceptance": round(s.acceptance, 6),
            "mean_alpha": round(s.mean_alpha, 6), "forced": s.forced, "steps": s.steps,
            "tokens_per_step": round(s.tokens_per_step, 6),
            "prompt_ms": round(s.prompt_seconds * 1e3, 3),
            "predicted_ms": round(s.decode_seconds * 1e3, 3),
            "predicted_per_second": round(s.tokens_per_second, 3),
        }
    elif gens:
        stats = [g.stats for g in gens]
        drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
        steps, tokens = sum(s.steps for s in stats), sum(s.tokens for s in stats)
        decode = max(s.decode_seconds for s in stats)  # the choices are decoded together
        out["speculation"] = {
            "drafted": drafted, "accepted": accepted, "acceptance": round(accepted / drafted if drafted else 0.0, 6),
            "mean_alpha": round(sum(s.mean_alpha for s in stats) / len(stats), 6),
            "forced": sum(s.forced for s in stats), "steps": steps,
            "tokens_per_step": round(tokens / steps if steps else 0.0, 6),
            "prompt_ms": round(max(s.prompt_seconds for s in stats) * 1e3, 3),
            "predicted_ms": round(decode * 1e3, 3),
            "predicted_per_second": round(tokens / decode if decode > 0 else 0.0, 3),
        }
    return out


def finish_reason(reason: Optional[str], called: Optional[str] = None) -> str:
    """OpenAI's finish reason: "stop" (end of generation, a stop string, a
    grammar's end), ``called`` ("tool_calls" or "function_call") when the
    answer made calls, or "length" (max_tokens or the context)."""
    if reason == "stop":
        return called or "stop"
    return "length"


def message_of(text: str, spec: OutputSpec) -> Dict[str, Any]:
    """The assistant message of a whole chat output (tool calls parsed).

    Parsed as a stream of it is (StreamShaper), so that both answers agree
    also for an output cut off inside a call: a call whose name was written
    is a call, with the arguments written so far (as OpenAI answers a call
    cut by ``max_tokens``)."""
    if not spec.parses_calls and not spec.reasoning:
        return {"role": "assistant", "content": text}
    shaper = StreamShaper(spec)
    content = reasoning = ""
    calls: Dict[int, Dict[str, Any]] = {}
    for delta in shaper.feed(text) + shaper.finish():
        content += delta.get("content", "")
        reasoning += delta.get("reasoning_content", "")
        legacy = [{"index": 0, "function": delta["function_call"]}] if "function_call" in delta else ()
        for call in delta.get("tool_calls", legacy):
            fn = call["function"]
            entry = calls.setdefault(call["index"], {"id": call.get("id"), "type": "function",
                                                     "function": {"name": fn.get("name"), "arguments": ""}})
            entry["function"]["arguments"] += fn["arguments"]
    message: Dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if not calls:  # the text as streamed (outer whitespace held back, then dropped)
        return message
    message["content"] = content or None
    if spec.legacy:  # one call, without an id
        message["function_call"] = calls[0]["function"]
    else:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@dataclass
class Reply:
    """What the stream of one request says: its id, time and fingerprint."""

    id: str
    created: int
    model: str
    fingerprint: str
    chat: bool

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def whole(self, choices: List[Dict[str, Any]], usage_: Dict[str, Any]) -> Dict[str, Any]:
        """A whole (non-streamed) response body."""
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": choices, "usage": usage_}

    def chunk(self, delta_or_text: Any, reason: Optional[str] = None, usage_: Any = None,
              with_usage: bool = False, index: int = 0, logprobs: Any = None) -> Dict[str, Any]:
        """One streamed chunk of choice ``index`` (``with_usage``: the
        ``usage: null`` OpenAI puts in every chunk when usage was asked for)."""
        if self.chat:
            choice = {"index": index, "delta": delta_or_text, "finish_reason": reason, "logprobs": logprobs}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": delta_or_text, "finish_reason": reason, "logprobs": logprobs}
            obj = "text_completion"
        data = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [choice]}
        if with_usage:
            data["usage"] = usage_
        return data

    def usage_chunk(self, usage_: Dict[str, Any]) -> Dict[str, Any]:
        """The last chunk of a stream that asked for usage (no choices)."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [], "usage": usage_}


class StreamShaper:
    """Text pieces of a chat stream as OpenAI deltas: a reasoning model's
    thinking as ``reasoning_content`` (``chat.ReasoningSplitter``), then
    content, or tool-call deltas when the request offered tools
    (``chat.ToolCallStreamParser``); with the deprecated ``functions``,
    ``function_call`` deltas."""

    def __init__(self, spec: OutputSpec) -> None:
        self._thinking = (ReasoningSplitter(inside=spec.reasoning == "inside", ends=spec.thinking_ends)
                          if spec.reasoning else None)
        self._parser = ToolCallStreamParser(tool_names=spec.tool_names) if spec.parses_calls else None
        self._parallel = spec.parallel
        self._legacy = spec.legacy
        self._key = spec.calls_key

    @property
    def called(self) -> Optional[str]:
        """The finish reason of the calls streamed ("tool_calls" or "function_call"), None if none was."""
        return self._key if self._parser is not None and self._parser.n_calls > 0 else None

    def feed(self, piece: str) -> List[Dict[str, Any]]:
        if self._thinking is None:
            return self._answer(piece)
        return self._after_thinking(self._thinking.feed(piece))

    def finish(self) -> List[Dict[str, Any]]:
        out = self._after_thinking(self._thinking.finish()) if self._thinking is not None else []
        return out + (self._keep(self._parser.finish()) if self._parser is not None else [])

    def _after_thinking(self, deltas: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for delta in deltas:
            out += self._answer(delta["text"]) if "text" in delta else [delta]
        return out

    def _answer(self, piece: str) -> List[Dict[str, Any]]:
        if self._parser is None:
            return [{"content": piece}] if piece else []
        return self._keep(self._parser.feed(piece))

    def _keep(self, deltas: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        if not self._parallel:  # the first call only
            deltas = [d for d in deltas if "tool_calls" not in d or d["tool_calls"][0]["index"] == 0]
        if not self._legacy:
            return deltas
        # OpenAI's function_call deltas: the call's name once, then pieces of its arguments (no index, no id)
        return [{"function_call": d["tool_calls"][0]["function"]} if "tool_calls" in d else d for d in deltas]


class LogprobFormatter:
    """``TokenLogprob`` entries (core/logprobs.py) in the shapes the APIs
    report: OpenAI chat's ``{"content": [...]}``, the legacy completions'
    ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (offsets
    continue across the chunks of a stream), llama-server's
    ``completion_probabilities``."""

    def __init__(self, tokenizer: Any, top: int, offset: int = 0, as_ids: bool = False) -> None:
        self._tokenizer = tokenizer
        self._top = top
        self._offset = offset  # the legacy text_offset of the next token
        # Offsets count the characters of the text: a character split across tokens
        # counts once, at the token that completes it.
        self._chars = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._as_ids = as_ids  # vLLM's return_tokens_as_token_ids: "token_id:123" for the token strings

    def _text(self, token: int) -> "tuple[str, List[int]]":
        raw = self._tokenizer.token_bytes(token)
        return f"token_id:{token}" if self._as_ids else raw.decode("utf-8", errors="replace"), list(raw)

    def chat(self, entries: Sequence[Any]) -> Dict[str, Any]:
        content = []
        for e in entries:
            text, raw = self._text(e.token)
            alternatives = []
            for tok, lp in e.top[:self._top]:
                t, b = self._text(tok)
                alternatives.append({"token": t, "logprob": _finite(lp), "bytes": b})
            content.append({"token": text, "logprob": _finite(e.logprob), "bytes": raw,
                            "top_logprobs": alternatives})
        return {"content": content}

    def legacy(self, entries: Sequence[Any], first: Optional[int] = None, echo: str = "") -> Dict[str, Any]:
        """``first``: a token before the entries that nothing predicts (an
        echoed prompt's first), reported with null log-probabilities; its
        text counts in the offsets only if ``echo`` (the echoed text) starts
        with it, as a BOS the tokenizer added does not."""
        tokens: List[str] = []
        logprobs: List[Optional[float]] = []
        tops: List[Optional[Dict[str, float]]] = []
        offsets: List[int] = []
        if first is not None:
            text, raw = self._text(first)
            tokens.append(text)
            logprobs.append(None)
            tops.append(None)
            offsets.append(self._offset)
            chars = self._chars.decode(bytes(raw))  # "" for the first bytes of a character: counted where it ends
            if echo.startswith(chars):
                self._offset += len(chars)
        for e in entries:
            text, raw = self._text(e.token)
            tokens.append(text)
            logprobs.append(_finite(e.logprob))
            top: Dict[str, float] = {}
            for tok, lp in e.top[:self._top]:
                top.setdefault(self._text(tok)[0], _finite(lp))
            top.setdefault(text, _finite(e.logprob))  # OpenAI: the sampled token always, so up to top + 1
            tops.append(top)
            offsets.append(self._offset)
            self._offset += len(self._chars.decode(bytes(raw)))
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}

    def llama(self, entries: Sequence[Any]) -> List[Dict[str, Any]]:
        """llama-server's ``completion_probabilities`` (ids included)."""
        out = []
        for e in entries:
            text, raw = self._text(e.token)
            top = []
            for tok, lp in e.top[:self._top]:
                t, b = self._text(tok)
                top.append({"id": tok, "token": t, "bytes": b, "logprob": _finite(lp)})
            out.append({"id": e.token, "token": text, "bytes": raw, "logprob": _finite(e.logprob),
                        "top_logprobs": top})
        return out


def _finite(value: float) -> float:
    return value if value > NEG_INF_LOGPROB else NEG_INF_LOGPROB

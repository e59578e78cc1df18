"""llama-cpp-python as a peer: ``Llama`` plain or with ``LlamaPromptLookupDecoding``
(:class:`LcpRunner` for the suite, :class:`LcpPromptLookup` for the audit) and its server
(:class:`LcpServer`, serving)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .base import LAST, N_CTX, Engine, Sample, pair_paths
from .ours_batched import OpenAIServer


class LcpRunner:
    """``Llama`` with ``LlamaPromptLookupDecoding`` (or none); decode speed is (n − 1) tokens
    over first to last token, the prompt excluded as for the other engines."""

    def __init__(self, model: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._pld = LlamaPromptLookupDecoding
        # a draft model needs logits_all=True, else the score buffer overflows past n_batch tokens
        self.llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                         n_threads_batch=threads, draft_model=LlamaPromptLookupDecoding(),
                         logits_all=True, verbose=False)

    def sample(self, tokens: Sequence[int], max_tokens: int, setting: Any) -> Tuple[List[int], bool, Optional[float]]:
        """Generate from prompt ids (the setting's sampler, the others off) until an EOG or
        ``max_tokens`` ids: (ids, ended by an EOG, when the first token came)."""
        import llama_cpp

        llm = self.llm
        out: List[int] = []
        t_first, stopped = None, False
        gen = llm.generate(list(tokens), top_k=setting.top_k, top_p=setting.top_p, min_p=setting.min_p,
                           typical_p=1.0, temp=setting.temperature, repeat_penalty=1.0,
                           frequency_penalty=0.0, presence_penalty=0.0)
        try:
            for tok in gen:
                t_first = t_first or time.perf_counter()
                if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok):
                    stopped = True
                    break
                out.append(int(tok))
                if len(out) >= max_tokens:
                    break
        finally:
            gen.close()
        return out, stopped, t_first

    def run(self, text: str, max_tokens: int, setting: Any, seed: int, num_pred_tokens: int) -> Dict[str, Any]:
        """The suite's record of one generation (prompt lookup of ``num_pred_tokens``, none for 0)."""
        llm = self.llm
        llm.draft_model = self._pld(max_ngram_size=2, num_pred_tokens=num_pred_tokens) if num_pred_tokens else None
        llm.set_seed(seed)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        t_start = time.perf_counter()
        out, stopped, t_first = self.sample(tokens, max_tokens, setting)
        decode = (time.perf_counter() - t_first) if t_first is not None else 0.0
        n = len(out)
        return {
            "tokens": n, "tps": (n - 1) / decode if n > 1 and decode > 0 else None, "decode_seconds": decode,
            "prompt_seconds": (t_first - t_start) if t_first is not None else None, "prompt_tokens": len(tokens),
            "finish": "stop" if stopped else "length", "text": llm.detokenize(out).decode("utf-8", "replace"),
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):  # best effort, the process ends soon
            self.llm.close()


class LcpPromptLookup(Engine):
    """Audit: ``Llama`` with ``LlamaPromptLookupDecoding`` (its default 10 tokens)."""

    id = "lcp-pld"
    label = "llama-cpp-python Llama + LlamaPromptLookupDecoding (10 tokens)"
    chain = LAST
    ids_from = "the ids `Llama.generate` yields"

    def start(self, k: int, threads: int) -> None:
        self.runner = LcpRunner(self.ctx.target, threads, N_CTX)
        self.runner.llm.draft_model = self.runner._pld(max_ngram_size=2, num_pred_tokens=10)

    def one(self, job, setting):
        self.runner.llm.set_seed(job.seed)
        ids, stopped, _ = self.runner.sample(job.ids, self.ctx.max_tokens, setting)
        return Sample(job.index, job.prompt, job.text, job.seed, ids, stopped, produced=len(ids) + int(stopped))

    def stop(self) -> None:
        self.runner.close()

    def command(self) -> str:
        return (f"Llama(F32, n_ctx={N_CTX}, n_batch=512, n_threads={self.ctx.threads}, logits_all=True, "
                "draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)); "
                "set_seed(seed); generate(prompt_ids, temp=T, top_k=0, top_p=P, min_p=0, typical_p=1, "
                "repeat_penalty=1) until an EOG id or max_tokens")


class LcpServer(OpenAIServer):
    """Serving: ``python -m llama_cpp.server``, plain decoding (its prompt lookup would barely
    find repeats in chat requests)."""

    health = "/v1/models"

    def __init__(self) -> None:
        super().__init__("lcp-server", "llama-cpp-python server (python -m llama_cpp.server)", "lcp")

    def _command(self, k: int, threads: int, port: int) -> List[str]:
        target, _ = pair_paths()
        return [sys.executable, "-m", "llama_cpp.server", "--model", target, "--n_ctx", str(N_CTX),
                "--n_threads", str(threads), "--n_threads_batch", str(threads), "--port", str(port),
                "--host", "127.0.0.1"]

    def _ban_eos(self, ignore_eos: bool) -> Dict[str, Any]:
        """No ignore_eos here: a bias of −100 on every end id."""
        from ..common import pair_tokenizer

        return {"logit_bias": {str(t): -100.0 for t in pair_tokenizer().eog_ids}} if ignore_eos else {}

"""Reference rows from llama.cpp (llama-cpp-python) on the same prompts (`--include-llama-cpp`), batch 1.

Two modes, as in transformers_rows.py: greedy (`Llama.generate` with temp=0) and llama-cpp-python's prompt
lookup decoding (`LlamaPromptLookupDecoding(num_pred_tokens=K, max_ngram_size=n)` as the Llama's
draft_model), K the speculative config's num_speculative_tokens (10 when the method has none) and n its
prompt_lookup_max when it has one (else the library's default, 2). Both read our prompt token ids, stop on
our engine's EOS ids (keeping the EOS, as our output does) or at max_new_tokens, and decode greedily
whatever the bench's temperature.

llama.cpp runs the GGUF file's own quantized weights (Q4_K_M for the default model) in its own kernels
(8-bit activation blocks, an f16 KV cache), so its greedy output is compared with our plain output but is
not expected to equal it in bfloat16. The comparison that means something is against `--quantization gguf`
(the same blocks in our kernels: close, still not bit-exact); each row's label names the target it is
compared with.

llama.cpp runs in a worker process of its own (_Worker says why). Seconds cover the generation (its prompt
prefill included, as in our rows), measured in that process, never the model load: each mode's Llama is
built untimed, and its state is reset before every prompt so that no prompt reuses another's
KV cache (llama-cpp-python would reuse the common prefix, which a later turn shares with the earlier one).
Its prompt lookup keeps every position's logits, the prompt's too, as llama-cpp-python does for any draft
model: that cost is part of its row.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.bench.transformers_rows import DEFAULT_LOOKUP_TOKENS, GREEDY, PROMPT_LOOKUP

# A context holds the longest prompt so far plus the output, rounded up to this; a longer prompt rebuilds
# it (untimed). Sizing it to the model's whole window would cost a logits buffer of n_ctx x vocab floats
# in prompt lookup mode (262144 columns for Gemma 3).
CTX_STEP = 1024


def import_llama_cpp() -> tuple[Any, Any]:
    """(Llama, LlamaPromptLookupDecoding), imported only when the rows are asked for."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as exc:
        raise ValueError("--include-llama-cpp needs llama-cpp-python: pip install llama-cpp-python") from exc
    return Llama, LlamaPromptLookupDecoding


def model_file(name: str) -> str:
    """The GGUF file llama.cpp runs for the bench's model (a .gguf path or the default model's alias)."""
    from specdec.models.loading import gguf_file

    try:
        return gguf_file(name)
    except ValueError as exc:
        raise ValueError(f"--include-llama-cpp runs llama.cpp on a GGUF file: {exc}") from None


class _LlamaEngine:
    """The Llama objects of both modes, in whichever process runs them."""

    def __init__(self, model_path: str, eos: Sequence[int], max_new_tokens: int, lookup_tokens: int,
                 max_ngram_size: int | None, n_threads: int, n_gpu_layers: int) -> None:
        self._llama_class, lookup = import_llama_cpp()
        ngram = {} if max_ngram_size is None else {"max_ngram_size": max_ngram_size}
        self.draft = lookup(num_pred_tokens=lookup_tokens, **ngram)
        self.model_path, self.max_new_tokens, self.lookup_tokens = model_path, max_new_tokens, lookup_tokens
        self.n_threads, self.n_gpu_layers = n_threads, n_gpu_layers
        self._eos = frozenset(int(t) for t in eos)
        self._llms: dict[str, tuple[int, Any]] = {}  # mode -> (n_ctx, Llama)

    def _llm(self, mode: str, needed: int) -> Any:
        """This mode's Llama, (re)built when its context cannot hold `needed` tokens."""
        n_ctx, llm = self._llms.get(mode, (0, None))
        if needed <= n_ctx:
            return llm
        self._llms.pop(mode, None)
        llm = None  # the smaller context goes before the larger one is allocated
        n_ctx = -(-needed // CTX_STEP) * CTX_STEP
        lookup = mode == PROMPT_LOOKUP
        llm = self._llama_class(
            model_path=self.model_path, n_ctx=n_ctx, n_threads=self.n_threads, n_threads_batch=self.n_threads,
            n_gpu_layers=self.n_gpu_layers, verbose=False, draft_model=self.draft if lookup else None,
            # with a draft model llama-cpp-python keeps every position's logits whatever this says, but sizes
            # its logits buffer from this argument: False there overflows on prompts longer than n_batch
            logits_all=lookup,
        )
        self._llms[mode] = (n_ctx, llm)
        return llm

    def generate(self, prompt: Sequence[int], mode: str) -> tuple[list[int], float]:
        llm = self._llm(mode, len(prompt) + self.max_new_tokens + self.lookup_tokens + 1)  # + a draft's overshoot
        llm.reset()  # an empty KV cache: generate() alone would reuse the previous prompt's common prefix
        out: list[int] = []
        start = time.perf_counter()
        # repeat_penalty=1.0 (off): older versions default to 1.1, applied before the greedy pick
        for token in llm.generate(list(prompt), temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(int(token))
            if out[-1] in self._eos or len(out) >= self.max_new_tokens:
                break
        return out, time.perf_counter() - start


def _serve(conn: Any, settings: dict[str, Any]) -> None:
    """The worker process: builds the engine, then answers (prompt, mode) requests until told to stop."""
    engine = _LlamaEngine(**settings)
    while True:
        request = conn.recv()
        if request is None:
            return
        try:
            conn.send(("ok", engine.generate(*request)))
        except Exception as exc:  # reported in the parent, which owns the bench
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def worker_died_message(exitcode: int | None) -> str:
    """Why the bench stops when llama.cpp's process ends without answering: a signal (negative exit code) is
    a crash inside llama.cpp itself."""
    message = f"the llama.cpp worker process died (exit code {exitcode})"
    if exitcode is not None and exitcode < 0:
        message += (": llama.cpp crashed. A llama-cpp-python built for this CPU's native flags (GGML_NATIVE) "
                    "crashed so on a Xeon with AMX; rebuilt without them it ran: CMAKE_ARGS=\"-DGGML_NATIVE=OFF "
                    "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON\" pip install --force-reinstall "
                    "--no-cache-dir llama-cpp-python")
    return message


class _Worker:
    """A spawned process that runs llama.cpp. In our process it would share the OpenMP threads (a
    llama-cpp-python built with OpenMP loads the same libgomp as torch) with our AMX kernels and oneDNN, and
    ggml sets up each thread's AMX tiles only once: another library's tile release or configuration in
    between made its next tile multiply fault (SIGILL). A process of its own also keeps its thread pool
    from spinning against ours while we decode."""

    def __init__(self, settings: dict[str, Any]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, settings), daemon=True)
        self.process.start()
        child.close()

    def generate(self, prompt: Sequence[int], mode: str) -> tuple[list[int], float]:
        self.conn.send((list(prompt), mode))
        try:
            kind, value = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(worker_died_message(self.process.exitcode)) from None
        if kind == "error":
            raise RuntimeError(f"llama.cpp: {value}")
        return value

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
            self.process.join(10)


# Whether llama.cpp runs in a worker process (_Worker); tests that fake llama_cpp run it in process.
ISOLATE = True


@dataclass
class LlamaCppBaseline:
    model_path: str  # a GGUF file
    eos_token_ids: Sequence[int]
    max_new_tokens: int
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS
    max_ngram_size: int | None = None  # None: llama-cpp-python's default
    n_threads: int = 1
    n_gpu_layers: int = 0  # -1: every layer, where llama-cpp-python was built with a GPU backend
    compared_with: str = "bfloat16"  # our plain target: its dtype, or its quantization ("gguf": the same weights)
    _runner: Any = field(init=False, repr=False)  # a _Worker, or an in-process _LlamaEngine
    _ngram: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _, lookup = import_llama_cpp()  # a clear error here, in the parent, when it is missing
        settings = {"model_path": self.model_path, "eos": [int(t) for t in self.eos_token_ids],
                    "max_new_tokens": self.max_new_tokens, "lookup_tokens": self.lookup_tokens,
                    "max_ngram_size": self.max_ngram_size, "n_threads": self.n_threads,
                    "n_gpu_layers": self.n_gpu_layers}
        ngram = {} if self.max_ngram_size is None else {"max_ngram_size": self.max_ngram_size}
        self._ngram = int(lookup(num_pred_tokens=self.lookup_tokens, **ngram).max_ngram_size)
        self._runner = _Worker(settings) if ISOLATE else _LlamaEngine(**settings)

    def describe(self, mode: str) -> dict[str, Any]:
        common = {"compared_with": self.compared_with, "n_threads": self.n_threads, "n_gpu_layers": self.n_gpu_layers}
        vs = f", vs our {self.compared_with}"
        if mode == GREEDY:
            return {"label": "llama.cpp greedy" + vs, **common}
        return {
            "label": f"llama.cpp prompt lookup (K={self.lookup_tokens})" + vs,
            "num_pred_tokens": self.lookup_tokens,
            "max_ngram_size": self._ngram,
            **common,
        }

    def generate(self, prompt: Sequence[int], mode: str) -> tuple[list[int], float]:
        """Generated ids (without the prompt) and wall seconds of the generation alone."""
        return self._runner.generate(prompt, mode)

    def close(self) -> None:
        if isinstance(self._runner, _Worker):
            self._runner.close()

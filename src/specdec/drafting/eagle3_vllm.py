"""An EAGLE-3 drafter written for vLLM 0.32 (`vllm/model_executor/models/llama_eagle3.py`).

Our drafter directory is already in the speculators eagle3 layout, which vLLM reads; what it lacks is
the draft vocabulary's LM head: ours borrows the target's rows, while vLLM's draft model has its own
`lm_head` of `draft_vocab_size` rows and shares the target's only when the checkpoint has none, which
is right only for a full-vocabulary drafter. So the export stores those rows as `lm_head.weight` (vLLM
skips `t2d` and reads `d2t` as its `draft_id_to_target_id`; we skip `lm_head.weight`, so specdec loads
the export too). Proposal methods speculators 0.9.0 does not define (its eagle3 takes "greedy" only; ours
may add "dynamic_tree") move under `specdec`, or speculators' config validation rejects the file. The embedding stays shared
(vLLM uses the target's when the checkpoint has none). The verifier block names the target's local
folder, from which the `speculators` package loads the verifier's weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from specdec.drafting.drafter_format import CONFIG_FILE, WEIGHTS_FILE

if TYPE_CHECKING:
    from specdec.models.decoder import Decoder
    from specdec.models.loading import LoadedModel


def write_vllm_eagle3(source: Path, target: LoadedModel, target_folder: str, output: Path) -> dict[str, Any]:
    """Writes the EAGLE-3 drafter in `source` (made for `target`, loaded from `target_folder`) to `output`
    as vLLM loads it; returns the written config."""
    decoder = unscaled_decoder(target, "EAGLE-3")
    config = json.loads((source / CONFIG_FILE).read_text())
    tensors = load_file(str(source / WEIGHTS_FILE))
    dtype = tensors["fc.weight"].dtype
    draft_ids = torch.arange(tensors["d2t"].numel()) + tensors["d2t"]
    tensors["lm_head.weight"] = decoder.head_weight().detach()[draft_ids].to(dtype).contiguous()
    verifier = config["speculators_config"]["verifier"]
    verifier["name_or_path"] = target_folder
    verifier["architectures"] = list(getattr(target.config, "architectures", None) or [])
    # vLLM sizes the draft's fc from `num_aux_hidden_states` in the layer config, else assumes 3 (its
    # speculators reader keeps the layer ids where the draft model does not look for them)
    config["transformer_layer_config"]["num_aux_hidden_states"] = len(config["eagle_aux_hidden_state_layer_ids"])
    ours = config.setdefault("specdec", {})
    ours["shares_target_lm_head"] = False
    keep_speculators_proposals(config["speculators_config"], ours)
    output.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(output / WEIGHTS_FILE))
    (output / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return config


def unscaled_decoder(target: LoadedModel, kind: str) -> Decoder:
    """The target's native decoder; ValueError unless it embeds tokens unscaled: vLLM's `kind` draft embeds
    with the target's raw embedding table, while ours scales it as the target does (Gemma by sqrt(hidden))."""
    if target.decoder is None:
        raise ValueError(f"exporting the {kind} drafter needs the target's native runtime (its LM head)")
    scale = target.decoder.arch.embed_scale or 1.0
    if scale != 1.0:
        raise ValueError(f"the target scales its embeddings by {scale:g}; vLLM's {kind} draft embeds with the "
                         "target's unscaled embedding table, so this drafter would see other inputs there")
    return target.decoder


def keep_speculators_proposals(speculators: dict[str, Any], ours: dict[str, Any]) -> None:
    methods = speculators.get("proposal_methods", [])
    kept = [m for m in methods if m.get("proposal_type") == "greedy"]
    if len(kept) < len(methods):
        ours["proposal_methods"] = methods
        speculators["proposal_methods"] = kept or [{"proposal_type": "greedy", "speculative_tokens": 5}]
        speculators["default_proposal_method"] = "greedy"

"""A DFlash drafter written for vLLM 0.32 (`vllm/model_executor/models/qwen3_dflash.py`).

vLLM's DFlash computes the function ours does (context keys from `fc` + `hidden_norm` at the target's
positions, a [bonus, MASK x K] block at the next positions, the same layers, argmax per slot), but reads a
few things from the file that ours leaves implicit or states otherwise:
- the aux ids name the residual stream entering layer id, ours the output of layer id (`dflash_format.py`),
  so they are written plus one. vLLM appends the aux states in layer order and once per layer, which fixes
  the order of `fc`'s column blocks: unsorted or repeated ids are refused.
- causality: vLLM runs every draft layer causal when `sliding_window_non_causal` is false (what we save),
  ours attends bidirectionally within the block; so true, and `is_causal: false` in the layer config.
- RoPE: without a theta vLLM falls back to 1e6, and it sizes its cos/sin cache from
  `max_position_embeddings`; so both explicitly, the latter at least the target's.
- the LM head: with no `lm_head.weight` vLLM shares the target's whole head, right only for a full draft
  vocabulary (then a `d2t` fails to load, since vLLM has no parameter for it). A reduced vocabulary gets
  the target's rows as `lm_head.weight` and keeps `d2t`; `t2d` is dropped (vLLM skips it).
- K: vLLM's block is 1 + num_speculative_tokens long, ours always block_size, so the drafts agree only at
  K = block_size - 1, which the file states (a user's smaller K in specdec drafts vLLM's first K).
The embedding stays shared, so targets that scale it are refused as for EAGLE-3. Without our
`aux_layers_are_outputs` marker, specdec reads the export back as the speculators checkpoint it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from specdec.drafting.dflash_format import AUX_MARKER, aux_layer_outputs
from specdec.drafting.drafter_format import CONFIG_FILE, WEIGHTS_FILE
from specdec.drafting.eagle3_vllm import keep_speculators_proposals, unscaled_decoder

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel


def write_vllm_dflash(source: Path, target: LoadedModel, target_folder: str, output: Path) -> dict[str, Any]:
    """Writes the DFlash drafter in `source` (made for `target`, loaded from `target_folder`) to `output` as
    vLLM loads it, so that it drafts the tokens ours does; returns the written config. ValueError when it
    cannot (see the module note)."""
    decoder = unscaled_decoder(target, "DFlash")
    config = json.loads((source / CONFIG_FILE).read_text())
    outputs = aux_layer_outputs(config)
    if outputs != sorted(set(outputs)):
        raise ValueError(f"the drafter reads the target layers {outputs} in that order; vLLM hands a DFlash draft "
                         "each aux layer once, in ascending order, so its fc would see other features")
    config["aux_hidden_state_layer_ids"] = [i + 1 for i in outputs]
    config["sliding_window_non_causal"] = True
    layer = config["transformer_layer_config"]
    layer["is_causal"] = False
    theta = layer.get("rope_theta") or (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    layer["rope_theta"] = theta
    layer["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    target_positions = int(getattr(target.config.get_text_config(), "max_position_embeddings", 0) or 0)
    layer["max_position_embeddings"] = max(int(layer.get("max_position_embeddings", 32768)), target_positions)

    tensors = load_file(str(source / WEIGHTS_FILE))
    tensors.pop("t2d", None)
    d2t = tensors.pop("d2t", None)
    reduced = config["draft_vocab_size"] != layer["vocab_size"]
    if reduced:
        if d2t is None:
            raise ValueError(f"the drafter in {source} has a reduced draft vocabulary but no d2t map")
        tensors["d2t"] = d2t
        rows = decoder.head_weight().detach()[torch.arange(d2t.numel()) + d2t]
        tensors["lm_head.weight"] = rows.to(tensors["fc.weight"].dtype).contiguous()

    speculators = config["speculators_config"]
    speculators["verifier"]["name_or_path"] = target_folder
    speculators["verifier"]["architectures"] = list(getattr(target.config, "architectures", None) or [])
    ours = config.setdefault("specdec", {})
    ours.pop(AUX_MARKER, None)
    ours["shares_target_lm_head"] = not reduced
    keep_speculators_proposals(speculators, ours)
    for method in speculators["proposal_methods"]:
        method["speculative_tokens"] = config["block_size"] - 1
    output.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(output / WEIGHTS_FILE))
    (output / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return config

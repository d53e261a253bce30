"""Tiny random causal LMs of every native family (plus one non-native), saved as ordinary HF folders.

Each has a byte-level tokenizer (256 byte tokens + <pad>, <bos>, <eos>), so text prompts work.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<pad>", "<bos>", "<eos>"]
VOCAB = 259 + 13  # 256 bytes + 3 specials, padded to 272 like real models pad their embeddings


def make_tokenizer():
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
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def tiny_config(family: str, num_layers: int = 4, vocab_size: int = VOCAB):
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if family == "gemma3_text":
        return AutoConfig.for_model(
            "gemma3_text", head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
            layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"], **common,
        )
    if family == "qwen3":
        return AutoConfig.for_model("qwen3", head_dim=16, tie_word_embeddings=True, **common)
    if family == "mistral":
        return AutoConfig.for_model("mistral", sliding_window=8, **common)
    if family == "llama":
        return AutoConfig.for_model(
            "llama", rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}, **common,
        )
    return AutoConfig.for_model(family, **common)  # qwen2, gpt2-like fallbacks, ...


def make_tiny_model(folder: Path, family: str = "llama", num_layers: int = 4, seed: int = 0,
                    vocab_size: int = VOCAB, init_std: float = 0.5) -> str:
    """Writes a random model + tokenizer to `folder` and returns its path. A large init_std gives peaked
    next-token distributions, so greedy decoding is not a sequence of near-ties."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    config = tiny_config(family, num_layers, vocab_size)
    config.initializer_range = init_std
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return str(folder)

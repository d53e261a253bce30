"""What a quantization costs in quality: perplexity and top-1 agreement with bf16 on held-out text."""

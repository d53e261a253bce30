"""Side-by-side benchmark: plain and speculative decoding on the same prompts, in one process."""

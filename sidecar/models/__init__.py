"""A real causal LM (SmolLM2-135M) and real text, so codecs are judged on real KV caches.

Squared error says little about what a compressed KV cache does to generation; these
modules give the real model, its real KV for a long deterministic text, and the quality
of a model that continues from a decompressed KV (perplexity, KL, top-1 agreement).
"""

"""kvmoq: compress LLM KV caches and move them between machines over MoQT."""

__version__ = "0.1.0"

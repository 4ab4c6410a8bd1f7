"""What `kvmoq bench codec` measures, for kvmoq's codecs and the baselines alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Compression:
    """Per-prompt tables, then chunk -> byte strings -> chunk.

    `fit` gets a sample of the prompt's KV and returns the tables shipped once per prompt
    (None if the compression has none); `encode` and `decode` work on one chunk.
    """

    name: str
    fit: Callable[[torch.Tensor], bytes | None]
    encode: Callable[[torch.Tensor, bytes | None], list[bytes]]
    decode: Callable[[list[bytes], bytes | None], torch.Tensor]

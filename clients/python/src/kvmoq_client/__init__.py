"""Client library of the kvmoq sidecar: register KV buffers, publish and load KV caches.

The generated gRPC stubs live in `kvmoq_client.v1`. Buffer helpers (`kvmoq_client.buffers`)
and the transformers integration (`kvmoq_client.transformers_cache`) need torch and are
imported on their own, so a client without torch stays light.
"""

from kvmoq_client.aio import AsyncKVCacheClient, AsyncLoad
from kvmoq_client.client import DEFAULT_TARGET, KVCacheClient, Load
from kvmoq_client.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SidecarError,
    Unavailable,
)
from kvmoq_client.requests import paged_blocks, token_slots

__all__ = [
    "DEFAULT_TARGET",
    "AsyncKVCacheClient",
    "AsyncLoad",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "KVCacheClient",
    "Load",
    "NotFound",
    "SidecarError",
    "Unavailable",
    "paged_blocks",
    "token_slots",
]

"""The deterministic object payloads every interop peer publishes and verifies.

Stdlib only: the same module runs under the project venv (Python 3.11, moq-rs) and under
.venv-aiomoqt (Python 3.12), so a receiver on one stack can check, byte for byte, what a
publisher on the other stack sent.
"""

from __future__ import annotations

import hashlib
import random


def object_payload(seed: int, group: int, obj: int, size: int) -> bytes:
    """Payload of object (group, obj): a readable "group:object:" prefix, then seeded noise.

    The prefix makes a misplaced object obvious in a packet capture; the noise (seeded per
    object, so objects never repeat each other) catches truncation, reordering and
    corruption of bytes far from the start. Both are cut to exactly `size` bytes.
    """
    prefix = f"{group}:{obj}:".encode()
    noise = random.Random(f"{seed}/{group}/{obj}").randbytes(max(size - len(prefix), 0))
    return (prefix + noise)[:size]


def object_size(sizes: list[int], obj: int) -> int:
    """Object `obj` of every group takes its size from `sizes`, cycling."""
    return sizes[obj % len(sizes)]


def object_record(group: int, obj: int, payload: bytes) -> dict[str, int | str]:
    """The JSON line a subscriber prints per received object."""
    return {
        "group": group,
        "object": obj,
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }


def expected_records(
    seed: int, groups: int, objects: int, sizes: list[int]
) -> list[dict[str, int | str]]:
    """What a subscriber must print for a publisher run with the same parameters."""
    return [
        object_record(g, o, object_payload(seed, g, o, object_size(sizes, o)))
        for g in range(groups)
        for o in range(objects)
    ]

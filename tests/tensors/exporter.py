"""A model server's side of a shared-memory buffer, run as its own process by the tests.

Allocates a strided view in a /dev/shm file with the client library, prints its handle as
one JSON line, then obeys one command per stdin line: `check V` (is every element V?),
`fill V`, `exit` (unlink the file, then end), `leave` (end without unlinking: the
library's finalizer must). JSON and text only: nothing is pickled between the processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from google.protobuf import json_format
from kvmoq_client.buffers import SharedMemoryFile

SHAPE = (4, 8, 3)


def main(directory: Path) -> None:
    shared = SharedMemoryFile(8192, directory)
    # A permuted view at a page-unaligned offset: the handle must carry offset and strides.
    view = shared.view(4100, torch.float32, SHAPE[::-1]).permute(2, 1, 0)
    view.copy_(torch.arange(view.numel(), dtype=torch.float32).reshape(SHAPE))
    print(json_format.MessageToJson(shared.handle(view), indent=None), flush=True)
    for line in sys.stdin:
        command, _, value = line.partition(" ")
        if command == "check":
            print("ok" if bool((view == float(value)).all()) else "mismatch", flush=True)
        elif command == "fill":
            view.fill_(float(value))
            print("done", flush=True)
        elif command.strip() == "leave":
            return
        else:
            break
    shared.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

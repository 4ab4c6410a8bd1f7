"""`python -m fuzz TARGET [libFuzzer flags, e.g. -runs=10000 -max_total_time=60]`."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import atheris

from fuzz.targets import TARGETS, load


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: python -m fuzz TARGET [libFuzzer flags]; targets: {', '.join(TARGETS)}")
        raise SystemExit(2)
    with atheris.instrument_imports(include=["sidecar"]):
        target = load(sys.argv[1])

    def one_input(data: bytes) -> None:
        with contextlib.suppress(target.expected):
            target.run(data)

    with tempfile.TemporaryDirectory(prefix=f"kvmoq-fuzz-{sys.argv[1]}-") as corpus:
        for number, seed in enumerate(target.seeds()):
            (Path(corpus) / f"seed-{number}").write_bytes(seed)
        atheris.Setup([sys.argv[0], *sys.argv[2:], corpus], one_input)
        atheris.Fuzz()


if __name__ == "__main__":
    main()

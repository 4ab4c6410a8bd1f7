"""The package stays in small modules whose names say what they hold: no module under
sidecar/ past 800 lines (the bound the issue "A lighter house" set; a module that outgrows
it is split by what it does)."""

from __future__ import annotations

from pathlib import Path

MAX_MODULE_LINES = 800
SIDECAR = Path(__file__).resolve().parents[1] / "sidecar"


def test_no_module_under_sidecar_is_over_800_lines() -> None:
    sizes = {
        str(path.relative_to(SIDECAR)): len(path.read_text().splitlines())
        for path in SIDECAR.rglob("*.py")
    }
    assert sizes, SIDECAR
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}

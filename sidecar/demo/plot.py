"""PNG figures of the demo and the benchmarks: one set of axes, drawn by the caller.

Here rather than in bench/ because the demo draws one too and sidecar never imports bench.
matplotlib is imported on first use (it costs half a second) and with the Agg backend:
the figures are written to files, often on a machine without a display.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@contextmanager
def png(path: Path, size: tuple[float, float], dpi: int) -> Iterator[Axes]:
    """Axes of a `size`-inch figure, written to `path` at `dpi` once the block draws them;
    nothing is written if the block raises."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=size)
    try:
        yield axes
        figure.tight_layout()
        figure.savefig(path, dpi=dpi)
    finally:
        plt.close(figure)


def bars(
    axes: Axes,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    notes: dict[str, Sequence[str]] | None = None,
) -> None:
    """Grouped bars: one group per entry of `groups`, one bar per series in each.

    A None value leaves a gap marked "n/a" (a stalled or unmeasured run), so a missing
    figure never reads as zero. `notes` puts a small label above each bar of a series.
    """
    width = 0.8 / len(series)
    for index, (label, values) in enumerate(series.items()):
        offset = (index - (len(series) - 1) / 2) * width
        shown = [(group, value) for group, value in enumerate(values) if value is not None]
        axes.bar(
            [group + offset for group, _ in shown],
            [value for _, value in shown],
            width,
            color=f"C{index}",
            label=label,
        )
        for group, value in enumerate(values):
            x = group + offset
            if value is None:
                axes.annotate(
                    "n/a", (x, 0.01), xycoords=("data", "axes fraction"), ha="center", fontsize=7
                )
            elif notes is not None and label in notes:
                axes.annotate(
                    notes[label][group],
                    (x, value),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    fontsize=7,
                )
    axes.set_xticks(range(len(groups)), groups, fontsize=8)
    axes.margins(y=0.12)  # room for the notes above the tallest bar

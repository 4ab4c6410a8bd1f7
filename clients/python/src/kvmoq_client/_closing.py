"""The `with` support that the client's resources share: leaving the block calls `close()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ClosesOnExit:
    """Base of a resource whose `with` block ends in its own `close()`, error or not.

    One definition for the client, its buffers and `TransformersKV`, so the three cannot
    drift apart on what leaving a block does.
    """

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

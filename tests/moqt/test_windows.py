"""draft-14's window rules (sidecar/moqt/protocol/windows.py), case by case, as the draft states them
(docs: ../shared/reference/moqt-draft14.md, "Filter types")."""

from __future__ import annotations

import pytest

from sidecar.moqt.protocol.messages import (
    FilterType,
    JoiningFetch,
    StandaloneFetch,
    SubscriptionFilter,
)
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.moqt.protocol.windows import (
    WHOLE_GROUP,
    end_object,
    joining_range,
    standalone_range,
    subscription_window,
    whole_groups,
)

TRACK = FullTrackName((b"ns",), b"t")
LARGEST = Location(5, 3)


def absolute(group: int, obj: int, end_group: int | None = None) -> SubscriptionFilter:
    kind = FilterType.ABSOLUTE_START if end_group is None else FilterType.ABSOLUTE_RANGE
    return SubscriptionFilter(kind, Location(group, obj), end_group)


@pytest.mark.parametrize(
    ("filter", "largest", "window"),
    [
        # Next Group Start: {largest.group + 1, 0}; Largest Object: {largest.group,
        # largest.object + 1}; both open-ended, and {0, 0} before anything is published.
        (SubscriptionFilter(FilterType.NEXT_GROUP_START), LARGEST, (Location(6, 0), None)),
        (SubscriptionFilter(FilterType.LARGEST_OBJECT), LARGEST, (Location(5, 4), None)),
        (SubscriptionFilter(FilterType.NEXT_GROUP_START), None, (Location(0, 0), None)),
        (SubscriptionFilter(FilterType.LARGEST_OBJECT), None, (Location(0, 0), None)),
        # An absolute start in the past stands: what the track holds from there comes first.
        (absolute(2, 0), LARGEST, (Location(2, 0), None)),
        (absolute(2, 0, end_group=9), LARGEST, (Location(2, 0), 9)),
        # So does one ahead of the largest object, or before anything is published.
        (absolute(7, 1), LARGEST, (Location(7, 1), None)),
        (absolute(3, 2), None, (Location(3, 2), None)),
    ],
)
def test_subscription_windows(
    filter: SubscriptionFilter,
    largest: Location | None,
    window: tuple[Location, int | None],
) -> None:
    assert subscription_window(filter, largest) == window


def test_a_standalone_fetch_of_whole_groups_ends_after_every_object() -> None:
    whole = StandaloneFetch(TRACK, Location(2, 0), 4)
    assert standalone_range(whole) == (Location(2, 0), Location(4, WHOLE_GROUP))
    assert end_object(standalone_range(whole)[1]) is None
    part = StandaloneFetch(TRACK, Location(2, 1), 4, 7)
    assert standalone_range(part) == (Location(2, 1), Location(4, 7))
    assert end_object(standalone_range(part)[1]) == 7


@pytest.mark.parametrize(
    ("target", "start", "expected"),
    [
        # Relative: {start.group - joining_start, 0} to the object before the subscription's.
        (JoiningFetch(1, 2), Location(5, 4), (Location(3, 0), Location(5, 3))),
        # A subscription that starts a group: the fetch ends with the group before, whole.
        (JoiningFetch(1, 2), Location(5, 0), (Location(3, 0), Location(4, WHOLE_GROUP))),
        # Absolute: from group joining_start.
        (JoiningFetch(1, 1, absolute=True), Location(5, 4), (Location(1, 0), Location(5, 3))),
        # More groups back than exist: from group 0.
        (JoiningFetch(1, 9), Location(5, 4), (Location(0, 0), Location(5, 3))),
        # Nothing before a subscription that starts at the very beginning.
        (JoiningFetch(1, 2), Location(0, 0), None),
    ],
)
def test_joining_fetch_ranges(
    target: JoiningFetch, start: Location, expected: tuple[Location, Location] | None
) -> None:
    assert joining_range(target, start) == expected


@pytest.mark.parametrize(
    ("start", "end", "groups"),
    [
        (Location(2, 0), Location(4, WHOLE_GROUP), [2, 3, 4]),
        (Location(2, 1), Location(4, WHOLE_GROUP), [3, 4]),
        (Location(2, 0), Location(4, 5), [2, 3]),
        (Location(2, 1), Location(2, 5), []),
    ],
)
def test_whole_groups_of_a_range(start: Location, end: Location, groups: list[int]) -> None:
    assert list(whole_groups(start, end)) == groups

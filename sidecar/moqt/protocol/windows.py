"""Where subscriptions and fetches start and end: draft-14's rules as pure functions.

`relay.core` answers SUBSCRIBE and FETCH with these for every track it serves, a relay's
and a publisher's own alike (it once had a second copy of them in the publisher, and the
two disagreed on the "whole group" end and on a joining FETCH whose subscription starts at
object 0). Locations are inclusive on both ends here; FETCH_OK's exclusive End is
`messages.fetch_end`.
"""

from __future__ import annotations

from .messages import FilterType, JoiningFetch, StandaloneFetch, SubscriptionFilter
from .model import Location
from .wire import MAX_VARINT

WHOLE_GROUP = MAX_VARINT
"""An end object that stands for "to the end of the group": no object id is larger."""

START = Location(0, 0)


def after(largest: Location | None) -> Location:
    """The location right after ``largest`` (0/0 before anything is published): where a
    Largest Object subscription starts, and where a resumed one picks up."""
    return START if largest is None else Location(largest.group, largest.object + 1)


def subscription_window(
    filter: SubscriptionFilter, largest: Location | None
) -> tuple[Location, int | None]:
    """The first location a subscription delivers and its last group (None: open-ended).

    Next Group Start begins at the group after the largest object, Largest Object right after
    it, an absolute filter at its start; with nothing published yet, at 0/0.

    An absolute start before the largest object is kept: what the track still holds from
    there is served first. Draft-14 leaves past objects to FETCH, but a relay cluster
    resumes a subscription from an absolute start right after the last object it has
    (`relay.core`), and objects written while it was away would be lost otherwise; a
    subscriber that FETCHes the same range as well gets objects twice, and drops them.
    """
    if filter.filter_type == FilterType.NEXT_GROUP_START:
        return (START if largest is None else Location(largest.group + 1, 0)), None
    if filter.filter_type == FilterType.LARGEST_OBJECT:
        return after(largest), None
    assert filter.start is not None
    return filter.start, filter.end_group


def standalone_range(target: StandaloneFetch) -> tuple[Location, Location]:
    """A standalone FETCH's first and last location (a whole end group ends at WHOLE_GROUP)."""
    end_object = WHOLE_GROUP if target.end_object is None else target.end_object
    return target.start, Location(target.end_group, end_object)


def joining_range(
    target: JoiningFetch, subscription_start: Location
) -> tuple[Location, Location] | None:
    """A joining FETCH's range: from its first group (``joining_start`` groups before the
    subscription's, or that group when absolute) to the object before the subscription's
    first. None when nothing comes before it."""
    if subscription_start == START:
        return None
    group = subscription_start.group
    first = target.joining_start if target.absolute else group - target.joining_start
    if subscription_start.object > 0:
        end = Location(group, subscription_start.object - 1)
    else:
        end = Location(group - 1, WHOLE_GROUP)
    return Location(max(first, 0), 0), end


def end_object(end: Location) -> int | None:
    """A range's last location as StandaloneFetch's end object (None: the whole group)."""
    return None if end.object == WHOLE_GROUP else end.object


def whole_groups(start: Location, end: Location) -> range:
    """The groups a range covers from their first object to their last."""
    return range(start.group + (start.object > 0), end.group + (end.object == WHOLE_GROUP))

"""The MoQT drafts kvmoq speaks, and what each changes on the wire, named once.

A session runs one draft, fixed before its first message: by ALPN from draft 15 on
(`moqt-16`), by the version lists of CLIENT_SETUP and SERVER_SETUP under `moq-00` (draft 14).
Every difference a message family's encoding depends on is a field of `Draft`, named after
the behaviour it changes; the family's module (`messages/`, `data.py`, the session's
namespace half) reads that field, and nothing else asks which draft a session runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .errors import PUBLISH_DONE_RENUMBERED_16, PUBLISH_DONE_RENUMBERED_18
from .wire import QUIC_VARINTS, VI64, Encoder

LEGACY_ALPN = "moq-00"
"""The ALPN of drafts 07 to 14 over raw QUIC: the version is negotiated in SETUP."""
DRAFT_14_VERSION = 0xFF00000E
"""Draft 14's number in CLIENT_SETUP's and SERVER_SETUP's version fields."""


@dataclass(frozen=True, slots=True)
class Draft:
    number: int
    alpn: str
    wire: Encoder
    """How integers are written, everywhere a session writes one (and `wire.reader` how
    they are read): QUIC varints, or draft 18's vi64."""
    setup_version: int | None
    """The version CLIENT_SETUP lists and SERVER_SETUP picks; None where the ALPN names
    the draft and SETUP carries no version."""
    delta_types: bool
    """Key-value pairs carry their type as the difference from the previous pair's (so
    they go out in ascending order)."""
    request_parameters: bool
    """A request's delivery fields (priority, group order, forward, filter) and a reply's
    (expires, largest location) travel as message parameters, not as fixed fields; replies
    that describe a track end with its extensions; an unknown message parameter closes the
    session."""
    request_replies: bool
    """REQUEST_OK and REQUEST_ERROR answer every request that has no reply of its own
    (namespaces, track status, updates) and refuse every request; the error codes of the
    per-family *_ERROR messages are renumbered into one table."""
    fetch_flags: bool
    """A FETCH stream's objects start with serialization flags: what repeats the previous
    object's (group, subgroup, priority, the next object id) is left out, no object carries
    a status, and end-of-range markers say which objects do not exist."""
    omitted_priority: bool
    """A subgroup header (types 0x30-0x3D) or datagram (bit 0x08) may leave out the
    publisher priority: the track's default (128) then applies."""
    object_statuses: frozenset[int]
    """The object statuses an object may carry (draft 16 dropped DOES_NOT_EXIST, 0x1: a
    missing object is a gap in the ids)."""
    namespace_streams: bool
    """A SUBSCRIBE_NAMESPACE opens a stream of its own, where its reply, then NAMESPACE and
    NAMESPACE_DONE come; closing the stream unsubscribes (`session_namespaces.py`)."""
    namespace_options: bool
    """SUBSCRIBE_NAMESPACE says whether it wants namespaces, tracks or both (draft 16's
    Subscribe Options; draft 18 asks for tracks with SUBSCRIBE_TRACKS instead)."""
    request_streams: bool
    """Every request opens a bidirectional stream of its own; its replies, updates and
    PUBLISH_DONE travel there with no request id (the stream names the request), and it is
    withdrawn by resetting the stream (no UNSUBSCRIBE, FETCH_CANCEL or PUBLISH_NAMESPACE_DONE
    / _CANCEL). No MAX_REQUEST_ID: the QUIC stream limit bounds the open requests. Each side
    sends one SETUP, on a unidirectional stream of its own."""
    typed_parameters: bool
    """Message parameters are not key-value pairs: each type has its own value form (a
    byte, an integer, a bare location, or length-prefixed bytes)."""
    end_group_delta: bool
    """A subscription filter's end group is sent as its distance from the start group."""
    fetch_deltas: bool
    """A FETCH stream's objects carry their group and object ids as deltas from the
    previous object's."""
    first_object_flag: bool
    """Subgroup header types 0x50-0x7D: bit 0x40 says the stream starts at the subgroup's
    first object."""
    publish_done_renumbered: Mapping[int, int] = field(compare=False)
    """PUBLISH_DONE status codes this draft numbers otherwise than draft 14."""
    rendezvous: bool
    """A SUBSCRIBE may ask a relay to hold it until the track has a publisher
    (RENDEZVOUS_TIMEOUT, parameter 0x04); one that does not is refused at once."""

    @property
    def kvps_as_kept(self) -> bool:
        """Whether this draft writes key-value pairs as kvmoq keeps them (draft 14's form:
        absolute types, QUIC varints), so a relay may forward them untouched."""
        return not self.delta_types and self.wire is QUIC_VARINTS

    def __str__(self) -> str:
        return f"draft-{self.number:02d}"


DRAFT_14 = Draft(
    14,
    LEGACY_ALPN,
    QUIC_VARINTS,
    setup_version=DRAFT_14_VERSION,
    delta_types=False,
    request_parameters=False,
    request_replies=False,
    fetch_flags=False,
    omitted_priority=False,
    object_statuses=frozenset({0x0, 0x1, 0x3, 0x4}),
    namespace_streams=False,
    namespace_options=False,
    request_streams=False,
    typed_parameters=False,
    end_group_delta=False,
    fetch_deltas=False,
    first_object_flag=False,
    publish_done_renumbered={},
    rendezvous=False,
)
DRAFT_16 = Draft(
    16,
    "moqt-16",
    QUIC_VARINTS,
    setup_version=None,
    delta_types=True,
    request_parameters=True,
    request_replies=True,
    fetch_flags=True,
    omitted_priority=True,
    object_statuses=frozenset({0x0, 0x3, 0x4}),
    namespace_streams=True,
    namespace_options=True,
    request_streams=False,
    typed_parameters=False,
    end_group_delta=False,
    fetch_deltas=False,
    first_object_flag=False,
    publish_done_renumbered=PUBLISH_DONE_RENUMBERED_16,
    rendezvous=False,
)
DRAFT_18 = dataclasses.replace(
    DRAFT_16,
    number=18,
    alpn="moqt-18",
    wire=VI64,
    namespace_options=False,
    request_streams=True,
    typed_parameters=True,
    end_group_delta=True,
    fetch_deltas=True,
    first_object_flag=True,
    publish_done_renumbered=PUBLISH_DONE_RENUMBERED_18,
    rendezvous=True,
)
"""Draft 16 with what draft 18 changed."""

CODED: dict[int, Draft] = {draft.number: draft for draft in (DRAFT_14, DRAFT_16, DRAFT_18)}
"""Every draft whose messages and objects kvmoq can encode and decode."""

DRAFTS: dict[int, Draft] = {draft.number: draft for draft in (DRAFT_14, DRAFT_16, DRAFT_18)}
"""Every draft a session can speak."""
SPOKEN: tuple[Draft, ...] = (DRAFT_18, DRAFT_16, DRAFT_14)
"""What a session offers unless told otherwise, newest first: every draft kvmoq speaks, so
a relay serves peers of each and a client gets the newest its peer speaks."""


class UnknownDraft(ValueError):
    """A draft number kvmoq does not speak (a flag's value, say)."""


def drafts(numbers: Iterable[int]) -> tuple[Draft, ...]:
    """The drafts of `numbers`, newest first; UnknownDraft names any kvmoq does not speak."""
    chosen = []
    for number in numbers:
        if number not in DRAFTS:
            known = ", ".join(str(n) for n in DRAFTS)
            raise UnknownDraft(f"MoQT draft {number} is not spoken here (known: {known})")
        chosen.append(DRAFTS[number])
    return tuple(sorted(set(chosen), key=lambda draft: -draft.number))


def parse_drafts(text: str) -> tuple[Draft, ...]:
    """A flag's comma-separated draft numbers ("14,16"), newest first; UnknownDraft for a
    number kvmoq does not speak or a list that names none."""
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UnknownDraft(f"expected draft numbers such as 14,16; got {text!r}") from None
    if not numbers:
        raise UnknownDraft("name at least one MoQT draft")
    return drafts(numbers)


DRAFTS_HELP = (
    "MoQT drafts to speak, comma-separated, the newest preferred: 18 (ALPN moqt-18), 16 "
    "(moqt-16) and 14 (moq-00). Default all three: a peer gets the newest it speaks too"
)


def by_alpn(alpn: str | None, offered: Iterable[Draft]) -> Draft | None:
    """The draft a negotiated ALPN names among `offered` (None: none of them)."""
    return next((draft for draft in offered if draft.alpn == alpn), None)

"""What kvmoq does differently for one peer implementation, decided once from its SETUP.

Everything else follows the session's draft whoever the peer is. A deviation for one implementation
lives here, named after the behaviour it changes and saying why, so it is found in one
place and dropped in one place once that peer is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .messages import SetupParameters

MOQ_RS_IMPLEMENTATION = b"moq-lite-rs"
"""The IMPLEMENTATION setup parameter of moq-rs (moq-ffi 0.4.18), client and relay alike."""


@dataclass(frozen=True, slots=True)
class PeerQuirks:
    replays_history: bool = False
    """A SUBSCRIBE from this peer gets every cached object first, whatever its filter.

    For moq-rs alone: as a relay it subscribes upstream with the Largest Object filter, takes
    a PUBLISH_DONE on an ended track as a track with no groups, and its FETCH upstream for a
    group it lacks fails (tests/interop/README.md, 25-27), so without the history no group
    but the newest of a KV track gets through it. It ignores filters and keeps the groups it
    is sent (docs/wire-format.md, "Through relays").
    """

    closes_joined_groups: bool = False
    """A relay tells a subscription that starts mid-group that the group ended (an
    END_OF_GROUP status object at its start) when a later group begins for it first.

    For moq-rs alone: its subscriber takes the joined group's head by a joining FETCH and
    waits for that group to end before it takes later ones, and when the publisher had
    finished the group before the subscription began, no tail comes and nothing says so:
    it stalled after group 0, about one run in five on a busy machine
    (tests/interop/test_kvmoq_relay.py, moq-rs publisher and subscriber).
    """

    @classmethod
    def of(cls, peer: SetupParameters | None) -> PeerQuirks:
        """The quirks of the peer that sent ``peer`` in its SETUP (None: not set up yet)."""
        moq_rs = peer is not None and peer.implementation == MOQ_RS_IMPLEMENTATION
        return cls(replays_history=moq_rs, closes_joined_groups=moq_rs)

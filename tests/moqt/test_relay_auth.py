"""Relay authorization: tokens (moq-relay's JWT claims) checked at SETUP and per request.

The unit tests pin the rules (paths, scopes, token carriers, refusals); the others run
`kvmoq relay --auth-key` processes and real sessions on 127.0.0.1, as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import jwt
import pytest
import torch

from sidecar.cli import main as kvmoq
from sidecar.jwk import load_key
from sidecar.kvcache.naming import prompt_id
from sidecar.moqt.aio import api
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.moqt.aio.transport import MoqtConnectError
from sidecar.moqt.protocol.drafts import DRAFT_16
from sidecar.moqt.protocol.errors import (
    FetchErrorCode,
    PublishNamespaceErrorCode,
    SessionErrorCode,
    SubscribeErrorCode,
    SubscribeNamespaceErrorCode,
)
from sidecar.moqt.protocol.messages.parameters import (
    MAX_TOKEN_BYTES,
    SetupParameters,
    authorization_token,
)
from sidecar.moqt.protocol.model import FullTrackName, Location
from sidecar.moqt.relay.auth import AuthError, Authorizer, Grant, sign
from tests.support.aio import run
from tests.support.relay import (
    RelayProcess,
    cluster_relay,
    edge_flags,
    running_relay,
    settings_for,
)

ROOT = "kvcache.moq.arpa/v1"
MINE = (b"kvcache.moq.arpa/v1", b"SmolLM2-135M", b"0123abcd")
THEIRS = (b"kvcache.moq.arpa/v1", b"other-model", b"0123abcd")
TRACK = FullTrackName(MINE, b"int8")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An HS256 key, an EdDSA pair, and another HS256 key nobody trusts."""
    out = tmp_path_factory.mktemp("keys")
    paths = {name: out / f"{name}.jwk" for name in ("hs", "ed", "ed-public", "stranger")}
    assert kvmoq(["token", "generate", "--key", str(paths["hs"])]) == 0
    argv = ["token", "generate", "--key", str(paths["ed"]), "--algorithm", "EdDSA"]
    assert kvmoq([*argv, "--public", str(paths["ed-public"])]) == 0
    assert kvmoq(["token", "generate", "--key", str(paths["stranger"])]) == 0
    return paths


def setup_with(token: str) -> SetupParameters:
    return SetupParameters(authorization_tokens=(authorization_token(token.encode(), DRAFT_16),))


# The rules ------------------------------------------------------------------------------


def test_a_grant_covers_whole_path_segments_of_the_namespace() -> None:
    grant = Grant(publish=("kvcache.moq.arpa", "v1", "SmolLM2-135M"), subscribe=None)
    assert grant.may_publish(MINE)
    assert not grant.may_publish(THEIRS)
    assert not grant.may_publish((b"kvcache.moq.arpa/v1", b"SmolLM2-135"))  # not a segment
    assert not grant.may_publish((b"kvcache.moq.arpa/v1",))  # above the root
    assert not grant.may_publish((b"kvcache.moq.arpa/v1", b"SmolLM2-135M", b"\xff"))  # not UTF-8
    assert not grant.may_subscribe(MINE)  # no "sub" claim: nothing to read
    assert Grant.everything().may_subscribe(THEIRS) and not Grant.nothing().may_publish(MINE)
    assert Grant.everything().may_publish((b"\xff",))  # no key, no checks: any namespace
    follower = Grant(publish=None, subscribe=("kvcache.moq.arpa", "v1", "SmolLM2-135M"))
    assert follower.may_follow(()) and follower.may_follow(MINE)  # above or under its scope
    assert not follower.may_follow(THEIRS)


def test_tokens_are_read_from_the_setup_parameter_or_the_path(keys: dict[str, Path]) -> None:
    key = load_key(keys["hs"])
    token = sign(key, ROOT, publish="SmolLM2-135M", subscribe="", expires_in=60)
    authorizer = Authorizer(key)
    grant = authorizer.grant(setup_with(token), DRAFT_16)
    assert grant.may_publish(MINE) and not grant.may_publish(THEIRS)
    assert grant.may_subscribe(THEIRS)
    assert grant.expires is not None and grant.expires - time.time() <= 60
    assert authorizer.grant(SetupParameters(path=f"/kv?jwt={token}".encode()), DRAFT_16) == grant
    # EdDSA: signed with the private half, checked with the public one alone.
    signed = sign(load_key(keys["ed"]), ROOT, subscribe="")
    assert (
        Authorizer(load_key(keys["ed-public"]))
        .grant(setup_with(signed), DRAFT_16)
        .may_subscribe(MINE)
    )


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (SetupParameters(), SessionErrorCode.UNAUTHORIZED),
        (SetupParameters(path=b"/?jwt=not-a-jwt"), SessionErrorCode.MALFORMED_AUTH_TOKEN),
        (
            SetupParameters(authorization_tokens=(b"\x01\x05\x00",)),  # REGISTER an alias
            SessionErrorCode.UNKNOWN_AUTH_TOKEN_ALIAS,
        ),
        (SetupParameters(authorization_tokens=(b"\x40",)), SessionErrorCode.MALFORMED_AUTH_TOKEN),
    ],
)
def test_sessions_without_a_usable_token_are_refused(
    keys: dict[str, Path], setup: SetupParameters, code: SessionErrorCode
) -> None:
    with pytest.raises(AuthError) as refused:
        Authorizer(load_key(keys["hs"])).grant(setup, DRAFT_16)
    assert refused.value.code == code


def test_a_token_over_the_length_bound_is_refused_though_validly_signed(
    keys: dict[str, Path],
) -> None:
    key = load_key(keys["hs"])
    authorizer = Authorizer(key)

    def padded(size: int) -> str:
        claims = {"root": ROOT, "pub": "", "iat": int(time.time()), "pad": "x" * size}
        return jwt.encode(claims, key.key, "HS256")

    assert authorizer.grant(setup_with(padded(MAX_TOKEN_BYTES // 2)), DRAFT_16).may_publish(MINE)
    long = padded(MAX_TOKEN_BYTES)
    assert len(authorization_token(long.encode(), DRAFT_16)) > MAX_TOKEN_BYTES
    with pytest.raises(AuthError) as refused:
        authorizer.grant(setup_with(long), DRAFT_16)
    assert refused.value.code == SessionErrorCode.MALFORMED_AUTH_TOKEN


def test_forged_expired_and_unsigned_tokens_are_refused(keys: dict[str, Path]) -> None:
    key = load_key(keys["hs"])
    authorizer = Authorizer(key)
    cases = {
        SessionErrorCode.MALFORMED_AUTH_TOKEN: [
            sign(load_key(keys["stranger"]), ROOT, publish=""),  # another key
            sign(load_key(keys["ed"]), ROOT, publish=""),  # another algorithm
            jwt.encode({"root": ROOT, "pub": "", "iat": int(time.time())}, None, "none"),
            jwt.encode({"root": ["a"], "pub": "", "iat": int(time.time())}, key.key, "HS256"),
        ],
        SessionErrorCode.EXPIRED_AUTH_TOKEN: [
            sign(key, ROOT, publish="", expires_in=10, now=time.time() - 60),
        ],
    }
    for code, tokens in cases.items():
        for token in tokens:
            with pytest.raises(AuthError) as refused:
                authorizer.grant(setup_with(token), DRAFT_16)
            assert refused.value.code == code, token


def test_a_public_path_needs_no_token(keys: dict[str, Path]) -> None:
    grant = Authorizer(load_key(keys["hs"]), public="kvcache.moq.arpa/v1/demo").grant(
        SetupParameters(), DRAFT_16
    )
    assert grant.may_publish((b"kvcache.moq.arpa/v1", b"demo", b"p")) and not grant.may_publish(
        MINE
    )


def test_token_sign_refuses_a_token_that_allows_nothing(keys: dict[str, Path]) -> None:
    assert kvmoq(["token", "sign", "--key", str(keys["hs"]), "--root", ROOT]) == 2
    key_text = json.loads(keys["hs"].read_text())
    assert key_text["alg"] == "HS256" and keys["hs"].stat().st_mode & 0o077 == 0


# Relay processes ------------------------------------------------------------------------


def token(keys: dict[str, Path], **claims: object) -> str:
    return sign(load_key(keys["hs"]), ROOT, **claims)  # type: ignore[arg-type]


@pytest.fixture
def guarded(cert: CertificatePaths, keys: dict[str, Path]) -> Iterator[RelayProcess]:
    with running_relay(cert, "--auth-key", str(keys["hs"])) as process:
        yield process


async def closed_with(
    url: str, cert: CertificatePaths, token: str | None
) -> tuple[int | None, str]:
    """Open a session with ``token``; the error code the relay closed it with, and when:
    during SETUP ("setup": a bad or expired token) or later ("later": one that expired)."""
    try:
        async with api.connect(url, settings_for(cert), token=token) as session:
            closed = await asyncio.wait_for(asyncio.shield(session.connection.closed), 10)
            return closed.error_code, "later"
    except MoqtConnectError as exc:
        return exc.error_code, "setup"


def test_a_guarded_relay_closes_sessions_without_a_valid_token(
    guarded: RelayProcess, cert: CertificatePaths, keys: dict[str, Path]
) -> None:
    async def main() -> None:
        unauthorized = (SessionErrorCode.UNAUTHORIZED, "setup")
        assert await closed_with(guarded.url, cert, None) == unauthorized
        forged = sign(load_key(keys["stranger"]), ROOT, publish="")
        malformed = (SessionErrorCode.MALFORMED_AUTH_TOKEN, "setup")
        assert await closed_with(guarded.url, cert, forged) == malformed
        # An expired token is refused at SETUP, not left to the relay's expiry sweep.
        expired = token(keys, publish="", expires_in=10, now=time.time() - 60)
        at_setup = (SessionErrorCode.EXPIRED_AUTH_TOKEN, "setup")
        assert await closed_with(guarded.url, cert, expired) == at_setup
        soon = token(keys, publish="", expires_in=2)
        later = (SessionErrorCode.EXPIRED_AUTH_TOKEN, "later")
        assert await closed_with(guarded.url, cert, soon) == later

    run(main)
    assert guarded.process.poll() is None  # refusing sessions costs the relay nothing


def test_a_token_scopes_what_its_session_may_publish_and_subscribe(
    guarded: RelayProcess, cert: CertificatePaths, keys: dict[str, Path]
) -> None:
    settings = settings_for(cert)
    publisher = api.Publisher()
    track = publisher.track(MINE, b"int8")

    async def main() -> None:
        async with (
            api.connect(
                guarded.url,
                settings,
                publisher=publisher,
                token=token(keys, publish="SmolLM2-135M"),
            ) as prefill,
            api.connect(
                f"{guarded.url}/?jwt={token(keys, subscribe='SmolLM2-135M')}", settings
            ) as decoder,
        ):
            await prefill.publish_namespace(MINE)
            with pytest.raises(api.RequestRefused) as refused:
                await prefill.publish_namespace(THEIRS)
            assert refused.value.code == PublishNamespaceErrorCode.UNAUTHORIZED
            with pytest.raises(api.RequestRefused) as refused:
                await prefill.subscribe(TRACK)  # a publishing token reads nothing
            assert refused.value.code == SubscribeErrorCode.UNAUTHORIZED

            await track.write(0, 0, b"kv", end_of_group=True)
            fetched = await decoder.fetch(TRACK, Location(0, 0), 0)
            assert [obj.payload async for obj in fetched] == [b"kv"]
            with pytest.raises(api.RequestRefused) as refused:
                await decoder.fetch(FullTrackName(THEIRS, b"int8"), Location(0, 0), 0)
            assert refused.value.code == FetchErrorCode.UNAUTHORIZED
            with pytest.raises(api.RequestRefused) as refused:
                await decoder.subscribe_namespace((b"elsewhere",))  # beside its scope
            assert refused.value.code == SubscribeNamespaceErrorCode.UNAUTHORIZED
            # Above its scope (moq-rs follows the empty prefix): taken, and narrowed to it.
            async with api.connect(
                guarded.url, settings, token=token(keys, publish="other-model")
            ) as other:
                await other.publish_namespace(THEIRS)
                namespaces = await decoder.subscribe_namespace((b"kvcache.moq.arpa/v1",))
                heard = await asyncio.wait_for(anext(namespaces), 10)
                assert heard == api.Announcement(MINE, True)
                await asyncio.sleep(0.3)  # THEIRS would have come by now
                await namespaces.unsubscribe()
                assert [a async for a in namespaces] == []
            with pytest.raises(api.RequestRefused) as refused:
                await decoder.publish_namespace(MINE)
            assert refused.value.code == PublishNamespaceErrorCode.UNAUTHORIZED
            # Refused requests leave the sessions up.
            assert (await decoder.track_status(TRACK)).largest == Location(0, 0)

    run(main)


def test_an_edge_presents_its_token_to_a_guarded_root(
    cert: CertificatePaths, keys: dict[str, Path], tmp_path: Path
) -> None:
    edge_token = tmp_path / "edge.jwt"
    edge_token.write_text(token(keys, publish="", subscribe="") + "\n")
    guard = ("--auth-key", str(keys["hs"]))
    settings = settings_for(cert)
    publisher = api.Publisher()
    track = publisher.track(MINE, b"int8")
    with ExitStack() as stack:
        root = stack.enter_context(cluster_relay(cert, *guard))
        upstream = (*edge_flags(root.process.url, cert.cert), "--upstream-token", str(edge_token))
        a = stack.enter_context(cluster_relay(cert, *upstream, *guard))
        b = stack.enter_context(cluster_relay(cert, *upstream, *guard))
        for edge in (a, b):
            edge.wait_for("upstream_sessions", 1)

        async def main() -> None:
            async with (
                api.connect(
                    a.process.url, settings, publisher=publisher, token=token(keys, publish="")
                ) as prefill,
                api.connect(b.process.url, settings, token=token(keys, subscribe="")) as decoder,
            ):
                await prefill.publish_namespace(MINE)
                await track.write(0, 0, b"kv", end_of_group=True)
                for _ in range(100):  # edge A's announcement reaches the root
                    try:
                        fetched = await decoder.fetch(TRACK, Location(0, 0), 0)
                        break
                    except api.RequestRefused:
                        await asyncio.sleep(0.1)
                assert [obj.payload async for obj in fetched] == [b"kv"]

        run(main)


@pytest.mark.slow
def test_sidecars_present_their_token_files_to_a_guarded_relay(
    guarded: RelayProcess, cert: CertificatePaths, keys: dict[str, Path], tmp_path: Path
) -> None:
    """`kvmoq sidecar --token FILE`: a prompt published by one sidecar loads, bit-exact, in
    another whose token lets it subscribe, and not in a third whose token does not. The
    sidecars share a prompt key (`--prompt-key`): the relay sees keyed prompt ids."""
    from kvmoq_client.v1 import kv_cache_pb2 as pb

    from tests.support.sidecar import (
        CHUNK,
        LAYOUT,
        MODEL,
        ContiguousKV,
        load,
        publish_whole,
        running_sidecar,
        shm_directory,
        spans,
        synthetic_kv,
    )

    files = {}
    for name, claims in {
        "prefill": {"publish": ""},
        "decoder": {"subscribe": ""},
        "outsider": {"publish": ""},
    }.items():
        files[name] = tmp_path / f"{name}.jwt"
        files[name].write_text(sign(load_key(keys["hs"]), "", **claims))  # type: ignore[arg-type]
    prompt_key = tmp_path / "prompt.key"
    prompt_key.write_bytes(b"a deployment's prompt key")
    prompt = list(range(5000, 5032))
    kv = synthetic_kv(LAYOUT, len(prompt), seed=5)
    every_token = pb.KVLocation(token_range=pb.TokenRange(start=0, end=len(prompt)))
    with ExitStack() as stack:
        shm = stack.enter_context(shm_directory())
        sidecars = {
            name: stack.enter_context(
                running_sidecar(
                    guarded.url,
                    cert,
                    *("--chunk-size", str(CHUNK), "--token", str(path)),
                    *("--prompt-key", str(prompt_key)),
                )
            )
            for name, path in files.items()
        }
        for sidecar in sidecars.values():
            sidecar.wait_ready()
        published = publish_whole(
            sidecars["prefill"], MODEL, LAYOUT, kv, prompt, shm, tracks=["fp16"]
        )
        keyed = prompt_id(prompt, CHUNK, prompt_key.read_bytes())
        assert published.prompt_id == keyed != prompt_id(prompt, CHUNK)
        for name, complete in (("decoder", True), ("outsider", False)):
            own = stack.enter_context(shm_directory())
            destination = ContiguousKV(LAYOUT, max_tokens=32, directory=own)
            decoder = sidecars[name]
            set_id = decoder.stub.RegisterBuffers(destination.request(MODEL)).buffer_set_id
            request = pb.LoadRequest(
                buffer_set_id=set_id, token_ids=prompt, destination=every_token, tracks=["fp16"]
            )
            _, finished = load(decoder.stub, request, timeout=60)
            if complete:
                assert finished.stop_reason == pb.STOP_REASON_COMPLETE
                assert torch.equal(destination.get(0, len(prompt)), kv)
            else:
                assert finished.stop_reason != pb.STOP_REASON_COMPLETE
                assert spans(finished.loaded) == []

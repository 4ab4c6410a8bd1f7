"""Who may publish and subscribe what on a relay: JWTs in moq-relay's format, checked per request.

Relays are not trusted with content, but they are trusted with routing: without a check,
anyone who reaches one can announce any namespace (and be routed every decoder's requests)
or load any prompt. A relay started with a key (``kvmoq relay --auth-key``) takes from each
session one token, verifies it once at SETUP, and checks every PUBLISH_NAMESPACE, PUBLISH,
SUBSCRIBE, FETCH, TRACK_STATUS and SUBSCRIBE_NAMESPACE against the ``Grant`` it carries.

The token is a JWT whose claims are moq-relay's (moq-token), so one token format serves both
relays: ``root`` (a path), ``pub`` and ``sub`` (suffixes under the root: where the holder may
publish and subscribe; absent means not at all, ``""`` means the whole root), ``exp`` and
``iat``. Keys are JWK files (``oct`` for HS256, ``OKP`` Ed25519 for EdDSA); PyJWT verifies
signatures and times, and only the key's own algorithm is accepted (never ``none``).

A client presents it as draft-14's AUTHORIZATION_TOKEN setup parameter (a Token with Alias
Type USE_VALUE), or as moq-relay does, in a ``jwt`` query parameter of the setup PATH.

Paths: a namespace tuple maps to the path of its fields joined by ``/``, each field UTF-8,
and paths compare by whole segments, so ``("kvcache.moq.arpa/v1", "SmolLM2-135M", id)`` is
``kvcache.moq.arpa/v1/SmolLM2-135M/<id>``, under the root ``kvcache.moq.arpa/v1`` but not
under ``kvcache.moq.arpa/v``. A field that is not UTF-8 is under no root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt

from ..protocol.drafts import Draft
from ..protocol.errors import DecodeError, SessionErrorCode
from ..protocol.messages.parameters import SetupParameters, token_value

Segments = tuple[str, ...]


class AuthError(Exception):
    """A session's token is missing, malformed, wrongly signed or expired."""

    def __init__(self, code: SessionErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def segments(path: str) -> Segments:
    """A path's segments (empty ones, from leading, trailing or doubled ``/``, dropped)."""
    return tuple(part for part in path.split("/") if part)


def namespace_segments(namespace: tuple[bytes, ...]) -> Segments | None:
    """The path segments of a namespace; None if a field is not UTF-8 (under no root)."""
    try:
        return segments("/".join(field.decode("utf-8") for field in namespace))
    except UnicodeDecodeError:
        return None


def _under(path: Segments | None, scope: Segments | None) -> bool:
    return path is not None and scope is not None and path[: len(scope)] == scope


@dataclass(frozen=True, slots=True)
class Grant:
    """What one session may do: publish and subscribe under these paths (None: not at all),
    until ``expires`` (Unix seconds; None: no end)."""

    publish: Segments | None
    subscribe: Segments | None
    expires: float | None = None
    unchecked: bool = False
    """No token checks at all: even a namespace that is no path (not UTF-8) is allowed."""

    @classmethod
    def everything(cls) -> Grant:
        """A relay without a key, and the relay's own session to its upstream."""
        return cls((), (), unchecked=True)

    @classmethod
    def nothing(cls) -> Grant:
        return cls(None, None)

    def may_publish(self, namespace: tuple[bytes, ...]) -> bool:
        return self.unchecked or _under(namespace_segments(namespace), self.publish)

    def may_subscribe(self, namespace: tuple[bytes, ...]) -> bool:
        """Whether tracks of ``namespace`` may be read (for SUBSCRIBE_NAMESPACE: the prefix,
        so every namespace announced under it is readable too)."""
        return self.unchecked or _under(namespace_segments(namespace), self.subscribe)

    def may_follow(self, prefix: tuple[bytes, ...]) -> bool:
        """Whether a SUBSCRIBE_NAMESPACE of ``prefix`` is taken: under the subscribe scope, or
        above it (moq-rs follows the empty prefix, whatever its token): the session then
        hears only of namespaces it may subscribe to."""
        path = namespace_segments(prefix)
        return self.unchecked or _under(path, self.subscribe) or _under(self.subscribe, path)

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


def read_token(path: Path | None) -> str | None:
    """The token in ``path`` (surrounding whitespace dropped), read at each call so that a
    rotated file is picked up at the next connection; None without a path."""
    return None if path is None else path.read_text().strip()


def sign(
    key: jwt.PyJWK,
    root: str,
    *,
    publish: str | None = None,
    subscribe: str | None = None,
    expires_in: float | None = None,
    now: float | None = None,
) -> str:
    """A token for ``root``: may publish under root/``publish`` and subscribe under
    root/``subscribe`` (None: not at all), for ``expires_in`` seconds (None: no end)."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"root": root, "iat": issued}
    if publish is not None:
        claims["pub"] = publish
    if subscribe is not None:
        claims["sub"] = subscribe
    if expires_in is not None:
        claims["exp"] = issued + int(expires_in)
    headers = {"kid": key.key_id} if key.key_id else None
    return jwt.encode(claims, key.key, algorithm=key.algorithm_name, headers=headers)


class Authorizer:
    """Checks sessions' tokens against one key; ``public`` paths need none."""

    def __init__(self, key: jwt.PyJWK, public: str | None = None) -> None:
        self._key = key
        self._public = None if public is None else segments(public)

    def grant(self, setup: SetupParameters, draft: Draft, now: float | None = None) -> Grant:
        """The grant of a session from its SETUP (read as `draft` writes it); AuthError to
        refuse the session."""
        token = _token_of(setup, draft)
        if token is None:
            if self._public is not None:
                return Grant(self._public, self._public)
            raise AuthError(SessionErrorCode.UNAUTHORIZED, "this relay needs a token")
        try:
            claims = jwt.decode(
                token,
                self._key.key,
                algorithms=[self._key.algorithm_name],
                options={"require": ["iat"], "verify_aud": False},
                leeway=0,
            )
        except jwt.ExpiredSignatureError:
            raise AuthError(SessionErrorCode.EXPIRED_AUTH_TOKEN, "the token has expired") from None
        except jwt.PyJWTError as exc:
            raise AuthError(
                SessionErrorCode.MALFORMED_AUTH_TOKEN, f"token refused: {exc}"
            ) from None
        root = claims.get("root", "")
        publish, subscribe = claims.get("pub"), claims.get("sub")
        for value in (root, publish, subscribe):
            if value is not None and not isinstance(value, str):
                raise AuthError(
                    SessionErrorCode.MALFORMED_AUTH_TOKEN, "root, pub and sub are paths"
                )
        expires = claims.get("exp")
        return Grant(
            None if publish is None else segments(root) + segments(publish),
            None if subscribe is None else segments(root) + segments(subscribe),
            float(expires) if expires is not None else None,
        )


def _token_of(setup: SetupParameters, draft: Draft) -> str | None:
    """The JWT a client sent: its AUTHORIZATION_TOKEN, else the setup PATH's ``jwt``."""
    if len(setup.authorization_tokens) > 1:
        raise AuthError(SessionErrorCode.MALFORMED_AUTH_TOKEN, "one token per session")
    for raw in setup.authorization_tokens:
        return _token_value(raw, draft)
    if setup.path is None:
        return None
    query = urlsplit(setup.path.decode("utf-8", errors="replace")).query
    values = parse_qs(query).get("jwt")
    return values[0] if values else None


def _token_value(raw: bytes, draft: Draft) -> str:
    try:
        return token_value(raw, draft).decode("utf-8")
    except DecodeError as exc:
        raise AuthError(exc.code, exc.reason) from None
    except UnicodeDecodeError:
        raise AuthError(SessionErrorCode.MALFORMED_AUTH_TOKEN, "token is not UTF-8") from None

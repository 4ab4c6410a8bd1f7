"""The sidecar's settings, each from a flag, an environment variable or a TOML file.

Precedence, highest first: command-line flag, `KVMOQ_<NAME>` environment variable, the
config file (`--config FILE` or `KVMOQ_CONFIG`), the default. One table (`OPTIONS`) lists
every setting once, so the flag, the variable, the file key and the help text cannot drift
apart: a Kubernetes pod sets env, an operator's file sets the rest, a person at a shell
overrides one flag.

Values from every source go through the same parser, and an error names the source it
came from, so a typo in the file is reported as a typo in the file.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sidecar.address import Address, parse_address
from sidecar.codec_process import DEFAULT_CODEC_THREADS
from sidecar.kvcache.errors import KVCodecError
from sidecar.kvcache.signing import CatalogSigner, CatalogTrust
from sidecar.kvcache.tracks import DEFAULT_TRACK, DEFAULT_TRACKS, parse_codec_names
from sidecar.moqt.aio.quic_backend import (
    SIDECAR_PREFERENCE,
    BackendName,
    fastest_sidecar_backend,
    installed,
)
from sidecar.moqt.protocol.drafts import DRAFTS_HELP, Draft, parse_drafts
from sidecar.transfer.track_quality import DEFAULT_MAX_KL, TrackChoice

T = TypeVar("T")

ENV_PREFIX = "KVMOQ_"
CONFIG_ENV = "KVMOQ_CONFIG"


class ConfigError(ValueError):
    """A setting that is missing or does not parse; the message names where it came from."""


def _unix_socket(text: str) -> Path:
    if not text.startswith("unix://") or len(text) == len("unix://"):
        raise ValueError(f"expected unix://PATH, got {text!r}")
    return Path(text.removeprefix("unix://"))


def _relay_url(text: str) -> str:
    if not text.startswith("moqt://"):
        raise ValueError(f"expected moqt://HOST:PORT, got {text!r}")
    return text


def _not_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(f"must be a number >= 0, got {text!r}")
    return value


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise ValueError(f"must be positive, got {text!r}")
        return value

    return parse


def _kl_bound(text: str) -> float:
    value = float(text)
    TrackChoice(max_kl=value)  # a bound no track meets is refused here, not at every load
    return value


def _tracks(text: str) -> tuple[str, ...]:
    try:
        return parse_codec_names(text)
    except KVCodecError as exc:
        raise ValueError(str(exc)) from None


def _track(text: str) -> str:
    names = _tracks(text)
    if len(names) != 1:
        raise ValueError(f"name one track, got {text!r}")
    return names[0]


REQUIRED = object()


MIN_PROMPT_KEY_BYTES = 16
MAX_PROMPT_KEY_BYTES = 1024


def _prompt_key(text: str) -> bytes:
    """A prompt key file's bytes (a trailing newline dropped): 16 to 1024 of them, e.g.
    `head -c 32 /dev/urandom > prompt.key` (`kvcache.naming` says what it keys)."""
    path = Path(text)
    try:
        key = path.read_bytes().removesuffix(b"\n")
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    if not MIN_PROMPT_KEY_BYTES <= len(key) <= MAX_PROMPT_KEY_BYTES:
        raise ValueError(
            f"{path}: {len(key)} bytes, expected {MIN_PROMPT_KEY_BYTES} to {MAX_PROMPT_KEY_BYTES}"
        )
    return key


def _loaded(load: Callable[[Path], T]) -> Callable[[str], T]:
    """A parser for an option naming a key file: the file is read (and checked) at start."""

    def parse(text: str) -> T:
        return load(Path(text))

    return parse


def _boolean(text: str | bool) -> bool:
    if isinstance(text, bool):  # TOML's true and false
        return text
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value in ("true", "1", "yes")


def _sidecar_backend(text: str) -> BackendName:
    if text == "auto":
        return fastest_sidecar_backend()
    if text not in SIDECAR_PREFERENCE:
        raise ValueError(f"expected auto or one of {', '.join(SIDECAR_PREFERENCE)}, got {text!r}")
    if not installed(text):  # type: ignore[arg-type]
        raise ValueError(f"{text} is not installed (pip install 'kvmoq[fast]')")
    return text  # type: ignore[return-value]


def _paths(text: str) -> tuple[Path, ...]:
    paths = tuple(Path(name.strip()) for name in text.split(",") if name.strip())
    if not paths or not all(path.is_absolute() for path in paths):
        raise ValueError(f"expected absolute directories separated by commas, got {text!r}")
    return paths


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: str | object | None
    """Parsed like any other source; None: unset; `REQUIRED`: must come from somewhere."""
    metavar: str
    help: str
    env_name: str | None = None
    """The environment variable, when not ENV_PREFIX + the name in capitals."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.env_name or ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("relay", _relay_url, REQUIRED, "URL", "the relay, moqt://HOST:PORT"),
    Option("ca", Path, None, "FILE", "CA file the relay's certificate chains to"),
    Option(
        "token",
        Path,
        None,
        "FILE",
        "token (kvmoq token sign) for a relay with --auth-key, read anew at each connection "
        "(a mounted Secret rotates)",
        env_name=ENV_PREFIX + "TOKEN_FILE",
    ),
    Option(
        "prompt_key",
        _prompt_key,
        None,
        "FILE",
        "the deployment's prompt key (16+ random bytes, the same on every sidecar): prompt "
        "ids are keyed with it, so relays cannot confirm a guessed prompt",
        env_name=ENV_PREFIX + "PROMPT_KEY_FILE",
    ),
    Option(
        "catalog_key",
        _loaded(CatalogSigner.load),
        None,
        "FILE",
        "the deployment's catalog key (Ed25519 JWK, kvmoq token generate --algorithm EdDSA): "
        "every catalog this sidecar publishes is signed with it",
        env_name=ENV_PREFIX + "CATALOG_KEY_FILE",
    ),
    Option(
        "trusted_keys",
        _loaded(CatalogTrust.load),
        None,
        "FILE",
        "public catalog keys (a JWK or JWK Set): loads take only catalogs signed by one of "
        "them; unset, any catalog the relay serves is taken",
        env_name=ENV_PREFIX + "TRUSTED_KEYS_FILE",
    ),
    Option("grpc", _unix_socket, REQUIRED, "unix://PATH", "socket of the model server's API"),
    Option("probe", parse_address, "127.0.0.1:7070", "HOST:PORT", "gRPC health over TCP"),
    Option(
        "probe_api",
        _boolean,
        "false",
        "BOOL",
        "also serve the KV API on the probe port (TCP, unauthenticated: a trusted network only)",
    ),
    Option("http", parse_address, "127.0.0.1:9464", "HOST:PORT", "/healthz /readyz /metrics"),
    Option("chunk_size", _positive(int), "128", "TOKENS", "tokens per chunk (MoQT group)"),
    Option(
        "tracks", _tracks, ",".join(DEFAULT_TRACKS), "LIST", "tracks a Publish offers by default"
    ),
    Option("default_track", _track, DEFAULT_TRACK, "TRACK", "track encoded eagerly"),
    Option("load_seconds", _positive(float), "5", "S", "load time budget without a deadline"),
    Option(
        "max_kl",
        _kl_bound,
        f"{DEFAULT_MAX_KL:g}",
        "KL",
        "a load's quality floor when its request sets none: each chunk goes only on tracks whose "
        "measured KL as served is within it, else is left to compute; the default admits the "
        "near-lossless tracks (fp16, bf16, int8, fp8); inf: no floor",
    ),
    Option("max_request_tokens", _positive(int), str(1 << 17), "N", "most tokens in one request"),
    Option("max_buffer_sets", _positive(int), "64", "N", "most buffer sets registered at once"),
    Option(
        "max_published_bytes",
        _positive(int),
        str(4 << 30),
        "BYTES",
        "KV held for published prompts; the oldest are withdrawn beyond it",
    ),
    Option("drain_seconds", _positive(float), "10", "S", "on SIGTERM, time loads get to finish"),
    Option("relay_timeout", _positive(float), "10", "S", "relay silent this long: session gone"),
    Option(
        "relay_stall_timeout",
        _positive(float),
        "1",
        "S",
        "while a lookup or load waits on the relay: relay deaf to PINGs this long, session gone "
        "(the load ends RELAY_GONE, /readyz turns 503, the sidecar reconnects)",
    ),
    Option(
        "relay_wait",
        _not_negative,
        "2",
        "S",
        "a load whose relay session is lost waits this long (from the loss) for the sidecar to "
        "reconnect and resume, then ends RELAY_GONE with what it wrote; a Load request may set "
        "its own (relay_wait); 0: never wait",
    ),
    Option("drafts", parse_drafts, "18,16,14", "N,N", DRAFTS_HELP),
    Option("max_datagram_size", _positive(int), "1350", "BYTES", "QUIC packet size"),
    Option(
        "quic_backend",
        _sidecar_backend,
        "auto",
        "STACK",
        "QUIC stack: aioquic, qh3, or auto: qh3 where installed (kvmoq[fast]), which kvmoq bench "
        "transport measures at 3x aioquic for 1350-byte packets and 2x for 16 KiB",
    ),
    Option("shm_roots", _paths, "/dev/shm", "DIRS", "where shared-memory handles may point"),
    Option(
        "codec_threads",
        _positive(int),
        str(DEFAULT_CODEC_THREADS),
        "N",
        "torch threads that encode and decode chunks: the model server beside the sidecar "
        "keeps the cores busy, and a chunk's tensor ops split over threads that wait on each "
        "other wait for its compute too (beside vLLM on 2 cores, 2 threads nearly doubled a "
        "load's time); more only on a node with idle cores",
    ),
)


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    relay: str
    ca: Path | None
    token: Path | None
    prompt_key: bytes | None
    catalog_key: CatalogSigner | None
    trusted_keys: CatalogTrust | None
    grpc: Path
    probe: Address
    probe_api: bool
    http: Address
    chunk_size: int
    tracks: tuple[str, ...]
    default_track: str
    load_seconds: float
    max_kl: float
    max_request_tokens: int
    max_buffer_sets: int
    max_published_bytes: int
    drain_seconds: float
    relay_timeout: float
    relay_stall_timeout: float
    relay_wait: float
    drafts: tuple[Draft, ...]
    max_datagram_size: int
    quic_backend: BackendName
    shm_roots: tuple[Path, ...]
    codec_threads: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option; unset flags stay None so lower sources can fill them."""
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help=f"TOML file of settings (env {CONFIG_ENV})"
    )
    for option in OPTIONS:
        default = {REQUIRED: "required", None: "optional"}.get(
            option.default, f"default {option.default}"
        )
        parser.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar,
            help=f"{option.help} (env {option.env}; {default})",
        )


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> SidecarConfig:
    """Flag > env > config file > default, for every option."""
    path = args.config or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    file_values = _read_file(path) if path is not None else {}
    values: dict[str, Any] = {}
    for option in OPTIONS:
        sources = (
            (option.flag, getattr(args, option.name, None)),
            (option.env, environ.get(option.env)),
            (f"{path}: {option.name}", file_values.get(option.name)),
        )
        source, raw = next(((s, v) for s, v in sources if v is not None), ("", None))
        if raw is None:
            if option.default is REQUIRED:
                raise ConfigError(f"set {option.flag}, {option.env} or {option.name} in a file")
            if option.default is None:
                values[option.name] = None
                continue
            source, raw = "default", option.default
        try:
            values[option.name] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return SidecarConfig(**values)


def _read_file(path: Path) -> dict[str, str]:
    """The file's settings as strings (lists joined by commas), for the common parsers."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    known = {option.name for option in OPTIONS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"config file {path}: unknown settings {unknown}; known: {sorted(known)}")
    return {
        key: ",".join(map(str, value)) if isinstance(value, list) else str(value)
        for key, value in data.items()
    }

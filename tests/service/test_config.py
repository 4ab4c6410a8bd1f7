"""Where each sidecar setting comes from: flag > KVMOQ_* env > TOML file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli import build_parser
from sidecar.cli import main as kvmoq
from sidecar.moqt.aio.quic_backend import installed
from sidecar.service.config import ConfigError, SidecarConfig, resolve


def config(argv: list[str], env: dict[str, str] | None = None) -> SidecarConfig:
    return resolve(build_parser().parse_args(["sidecar", *argv]), env or {})


def test_defaults_fill_what_no_source_sets() -> None:
    got = config(["--relay", "moqt://relay:4443", "--grpc", "unix:///run/kvmoq.sock"])
    assert (got.relay, got.grpc) == ("moqt://relay:4443", Path("/run/kvmoq.sock"))
    assert (got.probe, got.http, got.ca) == (("127.0.0.1", 7070), ("127.0.0.1", 9464), None)
    assert (got.chunk_size, got.tracks) == (128, ("fp16", "int8", "ac", "int4"))


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text(
        'relay = "moqt://file:1"\ngrpc = "unix:///file.sock"\nchunk_size = 64\n'
        'tracks = ["int8", "fp16"]\nprobe = "0.0.0.0:7000"\n'
    )
    env = {"KVMOQ_CONFIG": str(file), "KVMOQ_RELAY": "moqt://env:2", "KVMOQ_CHUNK_SIZE": "32"}
    got = config(["--chunk-size", "16"], env)
    assert got.chunk_size == 16  # flag
    assert got.relay == "moqt://env:2"  # env over file
    assert got.grpc == Path("/file.sock")  # file over default
    assert got.tracks == ("int8", "fp16")  # a TOML list
    assert got.probe == ("0.0.0.0", 7000)
    assert config(["--config", str(file)], {}).relay == "moqt://file:1"


def test_errors_name_the_source_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--relay, KVMOQ_RELAY or relay in a file"):
        config(["--grpc", "unix:///a.sock"])
    with pytest.raises(ConfigError, match="KVMOQ_CHUNK_SIZE: must be positive"):
        config(["--relay", "moqt://r:1", "--grpc", "unix:///a"], {"KVMOQ_CHUNK_SIZE": "0"})
    with pytest.raises(ConfigError, match="--grpc: expected unix://PATH"):
        config(["--relay", "moqt://r:1", "--grpc", "/a.sock"])
    file = tmp_path / "bad.toml"
    file.write_text('relay = "moqt://r:1"\ngrpc = "unix:///a"\ntrack = "int8"\n')
    with pytest.raises(ConfigError, match=r"unknown settings \['track'\]"):
        config(["--config", str(file)])
    file.write_text('relay = "moqt://r:1"\ngrpc = "unix:///a"\ndefault_track = "int9"\n')
    with pytest.raises(ConfigError, match=f"{file}: default_track"):
        config(["--config", str(file)])


def test_codecs_run_on_one_torch_thread_unless_told() -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    assert config(base).codec_threads == 1
    assert config(base, {"KVMOQ_CODEC_THREADS": "4"}).codec_threads == 4
    with pytest.raises(ConfigError, match="--codec-threads: must be positive"):
        config([*base, "--codec-threads", "0"])


def test_a_load_waits_two_seconds_for_a_lost_relay_unless_told() -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    assert config(base).relay_wait == 2.0
    assert config(base, {"KVMOQ_RELAY_WAIT": "0"}).relay_wait == 0.0
    assert config([*base, "--relay-wait", "7.5"]).relay_wait == 7.5
    for bad in ("-1", "inf", "nan", "soon"):
        with pytest.raises(ConfigError, match="--relay-wait"):
            config([*base, "--relay-wait", bad])


def test_loads_keep_to_the_near_lossless_tracks_unless_told() -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    assert config(base).max_kl == 1e-3
    assert config(base, {"KVMOQ_MAX_KL": "0.01"}).max_kl == 0.01
    assert config([*base, "--max-kl", "inf"]).max_kl == float("inf")
    for bad, words in (("0", "a KL bound > 0"), ("nan", "a KL bound > 0"), ("1e-9", "no track")):
        with pytest.raises(ConfigError, match=f"--max-kl: .*{words}"):
            config([*base, "--max-kl", bad])


def test_the_kv_api_on_the_probe_port_and_the_token_file_are_opt_in(tmp_path: Path) -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    got = config(base)
    assert (got.probe_api, got.token) == (False, None)
    assert config(base, {"KVMOQ_PROBE_API": "true"}).probe_api
    assert config([*base, "--token", "/run/kvmoq/token"]).token == Path("/run/kvmoq/token")
    assert config(base, {"KVMOQ_TOKEN_FILE": "/t"}).token == Path("/t")  # the documented name
    file = tmp_path / "sidecar.toml"
    file.write_text("probe_api = true\n")
    assert config([*base, "--config", str(file)]).probe_api
    with pytest.raises(ConfigError, match="KVMOQ_PROBE_API: expected true or false"):
        config(base, {"KVMOQ_PROBE_API": "maybe"})


def test_a_prompt_key_is_read_from_its_file_and_checked(tmp_path: Path) -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    key = tmp_path / "prompt.key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    assert config(base, {"KVMOQ_PROMPT_KEY_FILE": str(key)}).prompt_key == b"0123456789abcdef" * 2
    assert config(base).prompt_key is None
    key.write_bytes(b"short")
    with pytest.raises(ConfigError, match=r"--prompt-key: .*5 bytes, expected 16 to 1024"):
        config([*base, "--prompt-key", str(key)])
    with pytest.raises(ConfigError, match="No such file"):
        config([*base, "--prompt-key", str(tmp_path / "missing")])


def test_catalog_keys_are_read_and_checked_at_start(tmp_path: Path) -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    private, public, secret = tmp_path / "c.jwk", tmp_path / "c.pub.jwk", tmp_path / "hs.jwk"
    assert kvmoq(["token", "generate", "--key", str(private), "--algorithm", "EdDSA",
                  "--public", str(public)]) == 0  # fmt: skip
    assert kvmoq(["token", "generate", "--key", str(secret)]) == 0
    got = config(
        base, {"KVMOQ_CATALOG_KEY_FILE": str(private), "KVMOQ_TRUSTED_KEYS_FILE": str(public)}
    )
    assert got.catalog_key is not None and got.trusted_keys is not None
    assert got.trusted_keys.open(got.catalog_key.seal(b"{}")) == b"{}"
    assert (config(base).catalog_key, config(base).trusted_keys) == (None, None)
    with pytest.raises(ConfigError, match=r"--catalog-key: .*not an Ed25519 private key"):
        config([*base, "--catalog-key", str(secret)])
    with pytest.raises(ConfigError, match=r"KVMOQ_TRUSTED_KEYS_FILE: .*not a usable JWK file"):
        config(base, {"KVMOQ_TRUSTED_KEYS_FILE": str(tmp_path / "missing")})


def test_the_quic_stack_defaults_to_the_fastest_installed() -> None:
    base = ["--relay", "moqt://r:1", "--grpc", "unix:///a"]
    assert config(base).quic_backend == ("qh3" if installed("qh3") else "aioquic")
    assert config([*base, "--quic-backend", "aioquic"]).quic_backend == "aioquic"
    with pytest.raises(ConfigError, match="--quic-backend: expected auto or one of qh3, aioquic"):
        config([*base, "--quic-backend", "aiopquic"])  # the relay's stack: Python 3.12, no torch

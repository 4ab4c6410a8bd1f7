"""`kvmoq bench gpu`: the GPU path end to end, on a node with a CUDA GPU.

This process stands in for a model server: it holds a paged KV cache in FlashAttention's
layout (`[2, blocks, 16, kv_heads, head_dim]` per layer) on the GPU and hands it to two
sidecars as CUDA IPC handles, as the vLLM connector does. Sidecar P publishes a long prompt
read in place from scattered blocks through a local relay; sidecar D loads it in place into
other blocks of the same cache; every byte of the loaded blocks is compared with the source.

Figures: the publish and the load (seconds, GB/s of KV, time to the first chunk), the codecs
on the GPU (encode and decode GB/s of KV per track, one 128-token chunk at a time, beside
the same codec on the CPU), and the sidecar's write of a decoded chunk into the paged blocks
beside the host staging a CPU node's path would need instead (device to host and back).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.harness import Report, conclude, measured, one_thread
from sidecar.terminal import console

BLOCK_SIZE = 16
"""vLLM's block size on a GPU."""
GEOMETRIES = {"llama3-8b": (32, 8, 128), "smollm2": (30, 3, 64)}
"""Layers, KV heads, head size."""
CHUNK = 128
TRACKS = ("fp16", "int8", "fp8", "int4", "fp4", "ac")
QUANTIZING = ("int8", "fp8", "int4", "fp4")
MIN_CODEC_SPEEDUP = 5.0
"""Goal: the quantizing codecs encode and decode at least this many times faster on the GPU
than on the CPU (one thread, the sidecar's setting). fp16 is a copy either way, and `ac`'s
entropy coding runs on the CPU wherever its KV is."""
LOAD_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens", type=int, default=32768, help="prompt tokens (default 32768: 4 GiB fp16)"
    )
    parser.add_argument(
        "--geometry", choices=sorted(GEOMETRIES), default="llama3-8b",
        help="layers, KV heads and head size (default llama3-8b: 32 x 8 x 128)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (default 3)")


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("kvmoq bench gpu: no CUDA GPU here (the GPU check runs it on one)")
    if not CHUNK <= args.tokens <= 1 << 17 or args.tokens % BLOCK_SIZE:
        raise SystemExit(f"kvmoq bench gpu: --tokens in {CHUNK}..131072, a multiple of 16")
    report = measured("gpu", lambda children, cert: _measure(children, cert, args))
    if report is None:
        return 1
    conclude(report, goals, show, args.json)
    return 0 if report["goals_met"] else 1


async def _measure(children: Any, cert: Any, args: argparse.Namespace) -> Report:
    from kvmoq_client.buffers import share_cuda_kv
    from kvmoq_client.client import KVCacheClient
    from kvmoq_client.requests import paged_blocks

    from sidecar.demo.nodes import start_sidecar
    from sidecar.demo.services import start_relay

    layers, heads, head_dim = GEOMETRIES[args.geometry]
    device = torch.device("cuda", 0)
    blocks = args.tokens // BLOCK_SIZE
    # Two prompts' worth of blocks, the source's and the destination's interleaved at random.
    order = torch.randperm(2 * blocks, generator=torch.Generator().manual_seed(0)).tolist()
    source, target = order[:blocks], order[blocks:]
    generator = torch.Generator(device=device).manual_seed(1)
    caches = []
    for _ in range(layers):
        cache = torch.zeros((2, 2 * blocks, BLOCK_SIZE, heads, head_dim), dtype=torch.float16,
                            device=device)  # fmt: skip
        cache[:, source] = torch.randn(
            (2, blocks, BLOCK_SIZE, heads, head_dim), generator=generator, device=device
        ).half()
        caches.append(cache)
    torch.cuda.synchronize()
    kv_bytes = layers * 2 * args.tokens * heads * head_dim * 2
    relay = start_relay(children, cert, "--cache-bytes", str(3 * kv_bytes))
    flags = ("--max-published-bytes", str(4 * kv_bytes), "--tracks", "fp16,int8")
    scratch = Path(cert.cert).parent
    p = start_sidecar(children, "sidecar p", relay.url, cert.cert, scratch, *flags)
    d = start_sidecar(children, "sidecar d", relay.url, cert.cert, scratch, *flags)
    token_ids = [(7 * i) % 50000 for i in range(args.tokens)]
    buffers = share_cuda_kv(caches)

    def publish_and_load() -> dict[str, Any]:
        with KVCacheClient(p.grpc, timeout=LOAD_TIMEOUT_S) as to_p:
            p_set = to_p.register_buffers(buffers.register_request("bench-gpu"))
            started = time.perf_counter()
            to_p.publish(p_set, token_ids, paged_blocks(source), default_track="fp16")
            publish_s = time.perf_counter() - started
            to_p.unregister_buffers(p_set)  # the sidecar drops its mapping of the cache
        with KVCacheClient(d.grpc, timeout=LOAD_TIMEOUT_S) as to_d:
            d_set = to_d.register_buffers(buffers.register_request("bench-gpu"))
            started = time.perf_counter()
            found = to_d.lookup(d_set, token_ids)
            lookup_s = time.perf_counter() - started
            load = to_d.load(d_set, token_ids, paged_blocks(target), tracks=["fp16"],
                             timeout=LOAD_TIMEOUT_S)  # fmt: skip
            first_s = None
            for _ in load:
                first_s = first_s or time.perf_counter() - started
            load_s = time.perf_counter() - started
            finished = load.finished
            assert finished is not None
            to_d.unregister_buffers(d_set)
        loaded = sum(r.end - r.start for r in finished.loaded)
        exact = loaded == args.tokens and all(
            torch.equal(cache[:, target], cache[:, source]) for cache in caches
        )
        return {
            "publish_s": publish_s, "lookup_s": lookup_s, "ready_tokens": found.ready_tokens,
            "first_chunk_s": first_s, "load_s": load_s, "loaded_tokens": loaded, "exact": exact,
        }  # fmt: skip

    transfer = await asyncio.to_thread(publish_and_load)
    kv = torch.stack([cache[:, source[: CHUNK // BLOCK_SIZE]] for cache in caches])
    chunk = kv.reshape(layers, 2, CHUNK, heads, head_dim)
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "geometry": args.geometry,
        "tokens": args.tokens,
        "kv_bytes": kv_bytes,
        "relay_backend": relay.backend,
        "transfer": transfer,
        "codecs": _codec_rows(chunk, args.repeats),
        "write": _write_rows(chunk, args.repeats),
    }


def _timed(work: Callable[[], object], repeats: int, cuda: bool) -> float:
    """Median seconds of `work` after one warm-up, the GPU finished each time."""
    work()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        work()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _codec_rows(chunk: torch.Tensor, repeats: int) -> list[dict[str, Any]]:
    """Encode and decode GB/s of one chunk's KV per track, GPU against one CPU thread, and
    whether the GPU's payloads are the CPU's bytes."""
    from sidecar.kvcache.layout import KVLayout

    layers, _, _, heads, head_dim = chunk.shape
    layout = KVLayout(layers, heads, head_dim, dtype="float16")
    host = chunk.cpu()
    with one_thread():
        return [_codec_row(name, layout, chunk, host, repeats) for name in TRACKS]


def _codec_row(
    name: str, layout: Any, chunk: torch.Tensor, host: torch.Tensor, repeats: int
) -> dict[str, Any]:
    from sidecar.kvcache.codecs import get_codec

    codec = get_codec(name)
    tables = codec.fit_tables(layout, host)
    payloads = codec.encode(host, layout, tables)
    row: dict[str, Any] = {
        "track": name,
        "same_bytes": codec.encode(chunk, layout, tables) == payloads,
    }
    nbytes = chunk.numel() * chunk.element_size()
    for where, kv in (("gpu", chunk), ("cpu", host)):
        cuda = where == "gpu"

        def encode(kv: torch.Tensor = kv) -> object:
            return codec.encode(kv, layout, tables)

        def decode(device: torch.device = kv.device) -> object:
            return codec.decode(payloads, layout, tables, device=device)

        row[f"{where}_encode_gbs"] = nbytes / _timed(encode, repeats, cuda) / 1e9
        row[f"{where}_decode_gbs"] = nbytes / _timed(decode, repeats, cuda) / 1e9
    return row


def _write_rows(chunk: torch.Tensor, repeats: int) -> dict[str, Any]:
    """A decoded chunk written into scattered paged blocks on the GPU (the sidecar's
    `BufferSet.write`, on its codec stream), against staging it through host memory as a
    path without CUDA IPC would (device to host, then host to device)."""
    from sidecar.kvcache.layout import KVLayout
    from sidecar.service.buffers import BlockIds, BufferSet, KVBuffer, KVPart, Paged

    layers, _, tokens, heads, head_dim = chunk.shape
    count = 4 * tokens // BLOCK_SIZE
    caches = [
        torch.zeros((2, count, BLOCK_SIZE, heads, head_dim), dtype=chunk.dtype, device=chunk.device)
        for _ in range(layers)
    ]
    layout = KVLayout(layers, heads, head_dim, dtype="float16")
    buffers = BufferSet(
        "bench", layout, Paged(BLOCK_SIZE, count),
        [KVBuffer(layer, KVPart.KEY_VALUE, cache) for layer, cache in enumerate(caches)],
    )  # fmt: skip
    placement = BlockIds(tuple(range(count - 1, 0, -4))[: tokens // BLOCK_SIZE])
    pinned = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=True)

    def staged() -> None:
        pinned.copy_(chunk)
        chunk.copy_(pinned)

    nbytes = chunk.numel() * chunk.element_size()
    in_place = _timed(lambda: buffers.write(placement, range(tokens), chunk), repeats, True)
    through_host = _timed(staged, repeats, True)
    exact = torch.equal(buffers.read(placement, tokens), chunk)
    return {
        "in_place_gbs": nbytes / in_place / 1e9,
        "host_staging_gbs": nbytes / through_host / 1e9,
        "exact": exact,
    }


def goals(report: Report) -> dict[str, dict[str, Any]]:
    transfer = report["transfer"]
    quantizing = [row for row in report["codecs"] if row["track"] in QUANTIZING]
    slowest = min(
        min(
            row["gpu_encode_gbs"] / row["cpu_encode_gbs"],
            row["gpu_decode_gbs"] / row["cpu_decode_gbs"],
        )
        for row in quantizing
    )
    return {
        "in_place": {
            "goal": "every prompt token published and loaded in place, every byte exact",
            "met": bool(transfer["exact"]) and transfer["loaded_tokens"] == report["tokens"],
        },
        "same_bytes": {
            "goal": "every codec's GPU payloads are its CPU payloads, byte for byte",
            "met": all(row["same_bytes"] for row in report["codecs"]),
        },
        "codec_speed": {
            "goal": f"{', '.join(QUANTIZING)} >= {MIN_CODEC_SPEEDUP}x one CPU thread both ways",
            "slowest_speedup": slowest,
            "met": slowest >= MIN_CODEC_SPEEDUP,
        },
        "write": {
            "goal": "the in-place write of a chunk is exact and outruns host staging",
            "met": bool(report["write"]["exact"])
            and report["write"]["in_place_gbs"] > report["write"]["host_staging_gbs"],
        },
    }


def show(report: Report) -> None:
    from rich.table import Table

    out = console()
    transfer = report["transfer"]
    gib = report["kv_bytes"] / 2**30
    out.print(
        f"{report['device']}, torch {report['torch']}; {report['tokens']} tokens of"
        f" {report['geometry']} ({gib:.2f} GiB fp16 KV), relay on {report['relay_backend']}"
    )
    table = Table(title="In place over CUDA IPC, through a local relay")
    for column in ("step", "seconds", "GB/s of KV", "tokens", "exact"):
        table.add_column(column, justify="right")
    gbs = report["kv_bytes"] / 1e9
    table.add_row("publish (read + fp16 encode)", f"{transfer['publish_s']:.2f}",
                  f"{gbs / transfer['publish_s']:.2f}", str(report["tokens"]), "")  # fmt: skip
    table.add_row("lookup", f"{transfer['lookup_s']:.3f}", "", str(transfer["ready_tokens"]), "")
    table.add_row("load: first chunk", f"{transfer['first_chunk_s'] or 0:.3f}", "", "", "")
    table.add_row("load (fp16)", f"{transfer['load_s']:.2f}", f"{gbs / transfer['load_s']:.2f}",
                  str(transfer["loaded_tokens"]), "yes" if transfer["exact"] else "NO")  # fmt: skip
    out.print(table)
    codecs = Table(title="Codecs per 128-token chunk, GB/s of fp16 KV (CPU: one thread)")
    for column in ("track", "GPU encode", "CPU encode", "GPU decode", "CPU decode", "same bytes"):
        codecs.add_column(column, justify="right")
    for row in report["codecs"]:
        codecs.add_row(
            row["track"], f"{row['gpu_encode_gbs']:.1f}", f"{row['cpu_encode_gbs']:.2f}",
            f"{row['gpu_decode_gbs']:.1f}", f"{row['cpu_decode_gbs']:.2f}",
            "yes" if row["same_bytes"] else "NO",
        )  # fmt: skip
    out.print(codecs)
    write = report["write"]
    out.print(
        f"Write of a decoded chunk into scattered 16-token blocks: {write['in_place_gbs']:.1f}"
        f" GB/s in place; through host staging {write['host_staging_gbs']:.1f} GB/s"
    )
    for name, goal in report["goals"].items():
        out.print(f"Goal {name}: {goal['goal']}: " + ("met" if goal["met"] else "NOT met"))

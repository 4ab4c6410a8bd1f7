"""RelayLink in process against relay processes: what a session learnt outlives a reconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.aio import transport
from sidecar.moqt.aio.tls import CertificatePaths
from sidecar.service.relay_link import Backoff, RelayLink
from sidecar.transfer.adapt import ThroughputEstimate
from sidecar.transfer.publisher import KVPublisher
from tests.support.aio import off_the_loop
from tests.support.relay import running_relay, settings_for

WAIT_S = 30.0


@pytest.mark.slow  # the relay's shutdown grace
def test_the_next_session_starts_from_the_throughput_the_last_one_measured(
    cert: CertificatePaths,
) -> None:
    port = free_udp_port()
    link = RelayLink(
        f"moqt://127.0.0.1:{port}",
        settings_for(cert),
        KVPublisher(),
        chunk_size=16,
        backoff=Backoff(initial=0.05, maximum=0.2),
    )
    measured = ThroughputEstimate(bytes_per_second=3e6, samples=5)

    async def until(condition: Callable[[], bool]) -> None:
        async def poll() -> None:
            while not condition():
                await asyncio.sleep(0.02)

        await asyncio.wait_for(poll(), WAIT_S)

    async def main() -> None:
        running = asyncio.ensure_future(link.run())
        try:
            async with off_the_loop(running_relay(cert, port=port)):
                await until(lambda: link.subscriber is not None)
                first = link.subscriber
                assert first is not None and first.throughput == ThroughputEstimate()
                first.throughput = measured  # as its loads would have left it
                first.track_throughput["int8"] = measured
            await until(lambda: link.subscriber is None)
            async with off_the_loop(running_relay(cert, port=port)):
                await until(lambda: link.subscriber is not None)
                assert link.subscriber is not first
                assert link.subscriber.throughput == measured
                assert link.subscriber.track_throughput == {"int8": measured}
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    transport.run(main())

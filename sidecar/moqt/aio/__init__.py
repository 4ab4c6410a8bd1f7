"""The asyncio side: QUIC stacks behind one adapter, sessions on connections, TLS material,
and the application API (publish tracks, subscribe, fetch) on top."""

"""kvmoq's relay, sans-I/O: what a relay adds to an origin (``protocol.origin``): routing by
namespace, one upstream request per track or range, PUBLISH from publishers, an edge's
upstream, authorization, retention, and its metrics. Its asyncio server is
``aio.relay_server``."""

"""MoQT (drafts 14, 16 and 18: `drafts`) without I/O: wire codec, control messages, data streams,
the session state machine and its events, and the origin model that publishers and relays
both serve from (tracks, cache, outbox, serving), with the rules (windows, peer quirks) they
share."""

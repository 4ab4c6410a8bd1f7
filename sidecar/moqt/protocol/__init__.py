"""MoQT draft-14 without I/O: wire codec, control messages, data streams, the session state
machine and its events, and the rules (windows, peer quirks) that publishers and relays share."""

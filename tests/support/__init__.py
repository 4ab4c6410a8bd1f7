"""What test modules share, and no tests: the harnesses that start real relays, sidecars
and peers, the MoQT and KV helpers built on them, and the fixtures' building blocks.
A test module imports from here, never from another test module."""

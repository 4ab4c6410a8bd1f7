"""KV caches over MoQT: the publisher and subscriber that join `moqt` sessions to `kvcache`."""

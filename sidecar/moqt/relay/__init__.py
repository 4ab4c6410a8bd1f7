"""kvmoq's relay: the sans-I/O core (routing, upstream subscriptions, fan-out, cache, FETCH,
an edge's upstream), its parts, its metrics, and the asyncio server around it."""

"""`kvmoq demo`: prefill on one node, decode on another, with a real model and a real relay.

The demo starts its services as separate processes (a relay and a "prefill" model server
that publishes its prompt's KV cache), then plays the "decode" model server itself: it finds
the prompt, loads its KV through the relay in each compression, checks that generation
continues exactly as after recomputing, and reuses the prompt as the prefix of a longer one.
"""

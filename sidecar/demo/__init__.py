"""`kvmoq demo`: prefill on one node, decode on another, with a real model and a real relay.

Every service is its own process, as in a cluster: a relay, two sidecars, and two model
servers running SmolLM2 through `kvmoq_client`, each reaching the relay only through its own
sidecar. The prefill server publishes a prompt's KV cache; the decode server loads it in each
compression, checks that generation continues exactly as after recomputing, and reuses the
prompt as the prefix of a longer one. Modules: `children` (processes that die with the demo),
`services` (relay, bare prefill node), `nodes` (sidecars, model servers), `steps` (how the
model servers report progress and results), `prefill_server`, `decode_server` (which, under
`--keep`, stays up and answers requests), `decode` (recompute, quality, prefix reuse), `plot`
(PNG figures, shared with the benchmarks).
"""

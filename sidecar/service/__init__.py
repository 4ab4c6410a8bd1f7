"""The sidecar process: the gRPC API of kvmoq.v1 over transfer.KVPublisher/KVSubscriber.

Plain cores (`buffers`, `kv_service`, `relay_link`, `config`, `probes`) know nothing of
gRPC; `servicer` and `server` are the adapters that do.
"""

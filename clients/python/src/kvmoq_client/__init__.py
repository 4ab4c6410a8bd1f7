"""Client library of the kvmoq sidecar; the generated gRPC stubs live in `kvmoq_client.v1`."""

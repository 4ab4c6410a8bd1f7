"""Generated gRPC stubs of the kvmoq sidecar API (proto/kvmoq/v1), version 1.

Written by scripts/gen_proto.sh, never by hand: edit the .proto files and regenerate.
"""

"""Generated gRPC stubs (tools/gen_protos.py)."""

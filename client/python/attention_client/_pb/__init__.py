"""Generated protobuf/gRPC modules for attention.v1 (tools/gen_protos.py). Do not edit."""

#!/usr/bin/env python3
"""Regenerates attention_client/_pb/ from the repository's proto/attention/v1/*.proto.

Usage: python3 client/python/tools/gen_protos.py [OUT_DIR]
  OUT_DIR defaults to client/python/attention_client/_pb (the shipped modules).
Needs grpcio-tools (pip install grpcio-tools). The generated modules import each other with
package-relative imports (``from . import attention_pb2``) so they live inside the package
rather than claiming the top-level name ``attention``. tests/python/test_client_protos.py runs
this into a temporary folder and fails when the shipped modules differ (proto drift).
"""
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PROTO_ROOT = os.path.join(REPO, "proto")
PROTOS = ["attention/v1/attention.proto", "attention/v1/sequence.proto"]
DEFAULT_OUT = os.path.join(HERE, "..", "attention_client", "_pb")
MODULES = ["attention_pb2.py", "attention_pb2_grpc.py", "sequence_pb2.py", "sequence_pb2_grpc.py"]

_IMPORT = re.compile(r"^from attention\.v1 import (\w+) as (\w+)$", re.M)
# The gRPC stubs refuse to import under a grpcio older than the grpcio-tools that generated
# them. They use nothing newer than `_registered_method` (grpcio 1.63), so the stamp is set to
# the oldest grpcio this package declares (pyproject.toml) and has run with: 1.84.0, the
# GPU host's (scripts/gpu_minilm_check.sh).
MIN_GRPCIO = "1.84.0"
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M)


def generate(out_dir):
    from grpc_tools import protoc  # imported lazily: only needed to regenerate
    import grpc_tools
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                f"--grpc_python_out={tmp}"] + [os.path.join(PROTO_ROOT, p) for p in PROTOS]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with {rc}")
        for name in MODULES:
            with open(os.path.join(tmp, "attention", "v1", name)) as f:
                text = f.read()
            text = _IMPORT.sub(r"from . import \1 as \2", text)
            text = _GRPC_STAMP.sub(f"GRPC_GENERATED_VERSION = '{MIN_GRPCIO}'", text)
            with open(os.path.join(out_dir, name), "w") as f:
                f.write(text)
    init = os.path.join(out_dir, "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated protobuf/gRPC modules for attention.v1 (tools/gen_protos.py). '
                'Do not edit."""\n')
    return out_dir


if __name__ == "__main__":
    out = generate(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT)
    print("generated into", os.path.abspath(out))

#!/usr/bin/env python3
"""Regenerates attention_client/_pb/ from the repository's proto/attention/v1/*.proto.

Usage: python3 client/python/tools/gen_protos.py [OUT_DIR]
  OUT_DIR defaults to client/python/attention_client/_pb (the shipped modules).
Needs grpcio-tools == TOOLS_VERSION (pip install grpcio-tools==1.63.2, best in a venv): the
shipped modules come from the oldest generator this package supports, so they import under
every protobuf runtime >= its gencode version (5.26.1; the runtime refuses only gencode newer
than itself) and every grpcio >= MIN_GRPCIO. pyproject.toml's floors are these two versions;
tests/python/test_client_protos.py checks that they agree and tests/python/floor_deps_test.sh
runs the client tests under exactly those floors. The generated modules import each other with
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
# The generator pinned for the shipped modules: grpcio-tools 1.63.2 bundles protoc 26.1, whose
# Python gencode is protobuf 5.26.1 (PROTOBUF_GENCODE) and whose stubs need grpcio 1.63
# (`_registered_method`, grpc._utilities.first_version_is_lower).
TOOLS_VERSION = "1.63.2"
PROTOBUF_GENCODE = "5.26.1"
# The gRPC stubs warn (1.63 gencode) under a grpcio older than their stamp; the stamp is the
# oldest grpcio this package declares (pyproject.toml) and tests.
MIN_GRPCIO = "1.63.0"
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M)


def tools_version():
    """The installed grpcio-tools version ("" when not installed)."""
    try:
        from importlib.metadata import version
        return version("grpcio-tools")
    except Exception:
        return ""


def generate(out_dir, check_version=True):
    """Writes the modules into out_dir. check_version: refuse (RuntimeError) unless the installed
    grpcio-tools is TOOLS_VERSION (the drift test passes False and compares only what does not
    depend on the generator's version)."""
    if check_version and tools_version() != TOOLS_VERSION:
        raise RuntimeError(f"grpcio-tools {tools_version() or '(none)'} installed; the shipped "
                           f"modules are generated with grpcio-tools=={TOOLS_VERSION} "
                           f"(python3 -m venv /tmp/gen && /tmp/gen/bin/pip install "
                           f"grpcio-tools=={TOOLS_VERSION})")
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

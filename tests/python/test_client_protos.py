"""The protobuf/gRPC modules shipped in client/python/attention_client/_pb must be what
grpcio-tools generates from proto/attention/v1/*.proto today (catches proto drift).

Regenerates with client/python/tools/gen_protos.py into a temporary folder and compares:
- *_pb2.py: the serialized FileDescriptorProto each module registers (every message, field,
  enum, service and option; exact bytes), read from the source text, not imported;
- *_pb2_grpc.py: the text, ignoring only the lines stamped with the grpcio-tools version;
  and, when the whole text differs only by the version stamps, it passes.
Fix a failure by running: python3 client/python/tools/gen_protos.py
"""
import ast
import os
import re
import sys
import tempfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(ROOT, "client", "python", "tools")
SHIPPED = os.path.join(ROOT, "client", "python", "attention_client", "_pb")
HINT = "proto drift: regenerate with `python3 client/python/tools/gen_protos.py`"


def _descriptor(path):
    text = open(path).read()
    m = re.search(r"AddSerializedFile\((b'(?:[^'\\]|\\.)*')\)", text)
    assert m, f"no serialized descriptor in {path}"
    return ast.literal_eval(m.group(1))


_STAMPS = re.compile(r"^.*(Protobuf Python Version|GRPC_GENERATED_VERSION = ).*$", re.M)


def _grpc_text(path):
    return _STAMPS.sub("", open(path).read())


def test_shipped_gencode_matches_protos():
    pytest.importorskip("grpc_tools", reason="grpcio-tools not installed: cannot regenerate")
    sys.path.insert(0, TOOLS)
    try:
        import gen_protos
    finally:
        sys.path.remove(TOOLS)
    with tempfile.TemporaryDirectory() as tmp:
        gen_protos.generate(tmp)
        for name in gen_protos.MODULES:
            fresh, shipped = os.path.join(tmp, name), os.path.join(SHIPPED, name)
            assert os.path.exists(shipped), f"{name} missing from the package; {HINT}"
            if name.endswith("_pb2.py"):
                assert _descriptor(fresh) == _descriptor(shipped), f"{name}: {HINT}"
            else:
                assert _grpc_text(fresh) == _grpc_text(shipped), f"{name}: {HINT}"

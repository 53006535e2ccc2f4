"""The protobuf/gRPC modules shipped in client/python/attention_client/_pb must be what
grpcio-tools generates from proto/attention/v1/*.proto today (catches proto drift).

Regenerates with client/python/tools/gen_protos.py into a temporary folder and compares:
- *_pb2.py: the serialized FileDescriptorProto each module registers (every message, field,
  enum, service and option; exact bytes), read from the source text, not imported;
- *_pb2_grpc.py: with the pinned generator (gen_protos.TOOLS_VERSION) installed, the text,
  ignoring only the version-stamped lines; with another grpcio-tools, the RPC paths each stub
  calls (what does not depend on the generator's version);
and that the dependency floors in pyproject.toml are the shipped gencode's versions.
Fix a failure by running (grpcio-tools==gen_protos.TOOLS_VERSION, e.g. in a venv):
python3 client/python/tools/gen_protos.py
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


_PATHS = re.compile(r"'(/attention\.v1\.\w+/\w+)'")


def _grpc_paths(path):
    return sorted(set(_PATHS.findall(open(path).read())))


def _gen_protos():
    sys.path.insert(0, TOOLS)
    try:
        import gen_protos
    finally:
        sys.path.remove(TOOLS)
    return gen_protos


def test_floors_match_shipped_gencode():
    """pyproject's grpcio/protobuf floors are the stamps of the shipped modules."""
    g = _gen_protos()
    deps = open(os.path.join(ROOT, "client", "python", "pyproject.toml")).read()
    assert f'"grpcio>={g.MIN_GRPCIO}"' in deps, deps
    assert f'"protobuf>={g.PROTOBUF_GENCODE},<8"' in deps, deps
    for name in g.MODULES:
        text = open(os.path.join(SHIPPED, name)).read()
        if name.endswith("_pb2.py"):
            assert f"# Protobuf Python Version: {g.PROTOBUF_GENCODE}\n" in text, name
        else:
            assert f"GRPC_GENERATED_VERSION = '{g.MIN_GRPCIO}'\n" in text, name


def test_shipped_gencode_matches_protos():
    pytest.importorskip("grpc_tools", reason="grpcio-tools not installed: cannot regenerate")
    gen_protos = _gen_protos()
    pinned = gen_protos.tools_version() == gen_protos.TOOLS_VERSION
    with tempfile.TemporaryDirectory() as tmp:
        gen_protos.generate(tmp, check_version=False)
        for name in gen_protos.MODULES:
            fresh, shipped = os.path.join(tmp, name), os.path.join(SHIPPED, name)
            assert os.path.exists(shipped), f"{name} missing from the package; {HINT}"
            if name.endswith("_pb2.py"):
                assert _descriptor(fresh) == _descriptor(shipped), f"{name}: {HINT}"
            elif pinned:
                assert _grpc_text(fresh) == _grpc_text(shipped), f"{name}: {HINT}"
            else:
                assert _grpc_paths(fresh), fresh
                assert _grpc_paths(fresh) == _grpc_paths(shipped), f"{name}: {HINT}"

"""Integration: server reflection and grpc.health.v1 on the real attention-server binary.

Uses grpcio with raw bytes (no generated stubs): the reflection request
ServerReflectionRequest{list_services: ""} is field 7 (tag 0x3a, length 0); the response's
ListServiceResponse carries the full service names as strings, which are searched for.
Run: python3 -m pytest tests/integration/test_reflection.py  (ATTN_SERVER_BIN = the binary)
"""
import os
import signal
import subprocess
import tempfile
import time

import grpc
import pytest

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")
# grpcurl 1.8.6, installed by scripts/bootstrap.sh into the tools venv.
GRPCURL = os.path.join(os.environ.get("ATTN_DEPLOY_VENV", os.path.expanduser(
    "~/.cache/attention-server/deploy-venv")), "bin", "grpcurl")


@pytest.fixture(scope="module")
def server_address():
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file],
                                stderr=subprocess.PIPE)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            yield f"127.0.0.1:{int(open(port_file).read())}"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def channel(server_address):
    with grpc.insecure_channel(server_address) as ch:
        yield ch


def _identity(x):
    return x


def test_reflection_lists_services(channel):
    for version in ("v1alpha", "v1"):
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        call = channel.stream_stream(method, request_serializer=_identity,
                                     response_deserializer=_identity)
        try:
            responses = list(call(iter([b"\x3a\x00"]), timeout=10))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED and version == "v1":
                continue  # gRPC 1.51 serves v1alpha only
            raise
        assert responses, "no reflection response"
        body = b"".join(responses)
        assert b"attention.v1.AttentionService" in body
        assert b"grpc.health.v1.Health" in body


def test_health_serving(channel):
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=_identity,
                                response_deserializer=_identity)
    for service in (b"", b"attention.v1.AttentionService"):
        req = b"" if not service else b"\x0a" + bytes([len(service)]) + service
        assert check(req, timeout=10) == b"\x08\x01"  # status: SERVING
    with pytest.raises(grpc.RpcError) as err:
        check(b"\x0a\x03foo", timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def _fields(buf):
    """Top-level (field number, bytes) of the length-delimited fields of a protobuf message."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        if key & 7 == 2:
            n, i = _varint(buf, i)
            out.append((key >> 3, buf[i:i + n]))
            i += n
        elif key & 7 == 0:
            _, i = _varint(buf, i)
        else:
            raise AssertionError(f"unexpected wire type {key & 7}")
    return out


def _varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def test_reflection_describes_health_service(channel):
    """grpcurl's path to Health/Check: file_containing_symbol must give the health proto's
    descriptor (before the fix: error_response, "target server does not expose service")."""
    from google.protobuf import descriptor_pb2
    symbol = b"grpc.health.v1.Health"
    req = b"\x22" + bytes([len(symbol)]) + symbol  # file_containing_symbol = 4
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                 request_serializer=_identity, response_deserializer=_identity)
    (resp,) = list(call(iter([req]), timeout=10))
    fields = dict(_fields(resp))
    assert 7 not in fields, f"reflection error_response: {fields.get(7)!r}"
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for n, b in _fields(fields[4]) if n == 1]
    health = [f for f in files if f.package == "grpc.health.v1"]
    assert health, [f.name for f in files]
    assert [s.name for s in health[0].service] == ["Health"]
    assert {m.name for m in health[0].message_type} == {"HealthCheckRequest",
                                                        "HealthCheckResponse"}


def _protoset_files():
    from google.protobuf import descriptor_pb2
    path = os.environ.get("ATTN_PROTOSET", "build/proto/attention.protoset")
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(path, "rb").read())
    return {f.name: f for f in fds.file}


def test_protoset_documents_every_message_enum_and_rpc():
    """The protoset (what `grpcurl -protoset ... describe` reads) carries a comment for every
    message, enum and rpc of attention.v1 (DESIGN.md: public messages have docstrings)."""
    files = _protoset_files()
    undocumented = []
    for name in ("attention/v1/attention.proto", "attention/v1/sequence.proto"):
        f = files[name]
        comments = {tuple(loc.path): loc.leading_comments.strip()
                    for loc in f.source_code_info.location}
        # SourceCodeInfo paths: 4 = message_type, 5 = enum_type, 6 = service, 2 = method.
        items = [((4, i), m.name) for i, m in enumerate(f.message_type)]
        items += [((5, i), e.name) for i, e in enumerate(f.enum_type)]
        items += [((6, i, 2, j), f"{s.name}.{m.name}") for i, s in enumerate(f.service)
                  for j, m in enumerate(s.method)]
        undocumented += [f"{name}: {what}" for path, what in items if not comments.get(path)]
    assert not undocumented, undocumented


def _clear_json_names(messages):
    for m in messages:
        for f in m.field:
            f.ClearField("json_name")
        _clear_json_names(m.nested_type)


def test_protoset_matches_what_reflection_serves(channel):
    """The protoset describes the same protos the running server serves (a stale protoset
    would show comments for fields that are not there)."""
    from google.protobuf import descriptor_pb2
    files = _protoset_files()
    for symbol in (b"attention.v1.AttentionService", b"attention.v1.SequenceService"):
        req = b"\x22" + bytes([len(symbol)]) + symbol  # file_containing_symbol = 4
        call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=_identity, response_deserializer=_identity)
        (resp,) = list(call(iter([req]), timeout=10))
        served = [descriptor_pb2.FileDescriptorProto.FromString(b)
                  for n, b in _fields(dict(_fields(resp))[4]) if n == 1]
        for fd in served:
            mine = descriptor_pb2.FileDescriptorProto()
            mine.CopyFrom(files[fd.name])
            mine.ClearField("source_code_info")
            _clear_json_names(mine.message_type)  # protoc fills them only in descriptor sets
            assert mine == fd, f"{fd.name}: the protoset differs from the served descriptor"


def _grpcurl(*args):
    if not os.access(GRPCURL, os.X_OK):
        pytest.skip(f"grpcurl not installed at {GRPCURL} (scripts/bootstrap.sh installs it)")
    out = subprocess.run([GRPCURL, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_grpcurl_health_check_and_describe(server_address):
    """What an operator types: Health/Check through reflection, describe through reflection
    (no comments: gRPC C++ serves the compiled-in descriptors) and through the protoset
    (every comment)."""
    assert '"status": "SERVING"' in _grpcurl("-plaintext", server_address,
                                               "grpc.health.v1.Health/Check")
    method = "attention.v1.SequenceService.ExtendStream"
    served = _grpcurl("-plaintext", server_address, "describe", method)
    assert "rpc ExtendStream" in served
    protoset = os.environ.get("ATTN_PROTOSET", "build/proto/attention.protoset")
    described = _grpcurl("-plaintext", "-protoset", protoset, server_address, "describe", method)
    assert "// Decode loops: each request message gets exactly one ExtendResult" in described
    # Health with the protoset alone (no reflection): the protoset carries grpc.health.v1.
    assert '"status": "SERVING"' in _grpcurl("-plaintext", "-protoset", protoset, server_address,
                                               "grpc.health.v1.Health/Check")
    message = _grpcurl("-protoset", protoset, "describe", "attention.v1.ExtendRequest")
    assert "// Token index where k/v go" in message and "bool append_only = 7;" in message

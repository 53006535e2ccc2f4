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


@pytest.fixture(scope="module")
def channel():
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
            port = int(open(port_file).read())
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                yield ch
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


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

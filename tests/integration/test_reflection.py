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

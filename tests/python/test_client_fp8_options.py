"""attend()'s fp8 options (issue 20) on a live CPU server: the client encodes rotate, smooth_k,
qk_format and pv_format into AttendRequest.fp8 and refuses bad keys and values itself; the
server validates the formats for every backend (INVALID_ARGUMENT for impossible pairs and
unknown enum values, naming the field; attention.proto says so), ignores valid ones outside
`fp8`, and a CPU-only server
refuses backend "fp8" with the reason. The fp8 routes themselves run in
tests/gpu/gpu_fp8_backend_test.cc (GPU only).
Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q tests/python/test_client_fp8_options.py
"""
import os
import sys

import grpc
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from attention_client import AttentionClient  # noqa: E402
from attention_client.errors import FailedPrecondition, InvalidArgument  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import attention_pb2_grpc as pb_grpc  # noqa: E402
from live_server import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LiveServer("tcp", tmp_path_factory.mktemp("fp8opts"))
    yield s
    s.stop()


def qkv(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 8, 4, 64)).astype(np.float16) for _ in range(3)]


def test_client_encodes_every_option():
    with AttentionClient("127.0.0.1:9", timeout=1) as c:
        q, k, v = qkv()
        req = c.build_request(q, k, v, fp8={"rotate": False, "smooth_k": True,
                                            "qk_format": "int8_per_token", "pv_format": "16bit"})
        assert req.fp8.HasField("rotate") and not req.fp8.rotate
        assert req.fp8.HasField("smooth_k") and req.fp8.smooth_k
        assert req.fp8.qk_format == pb.Fp8Options.QK_INT8_PER_TOKEN
        assert req.fp8.pv_format == pb.Fp8Options.PV_16BIT
        unset = c.build_request(q, k, v)
        assert not unset.HasField("fp8")
        as_pb = c.build_request(q, k, v, fp8=pb.Fp8Options(smooth_k=False))
        assert as_pb.fp8.HasField("smooth_k") and not as_pb.fp8.smooth_k
        numpy_bool = c.build_request(q, k, v, fp8={"rotate": np.bool_(False)})
        assert numpy_bool.fp8.HasField("rotate") and not numpy_bool.fp8.rotate


@pytest.mark.parametrize("fp8, needle", [
    ({"qk": "int8_per_token"}, "unknown keys ['qk']"),
    ({"rotate": "yes"}, "fp8.rotate must be a bool"),
    ({"qk_format": "int4"}, "fp8.qk_format must be one of"),
    ({"pv_format": "fp8"}, "fp8.pv_format must be one of"),
    ("int8", "fp8 must be a dict"),
    ({"qk_format": ["int8_per_token"]}, "fp8.qk_format must be one of"),  # unhashable values
    ({"pv_format": {"a": 1}}, "fp8.pv_format must be one of"),
])
def test_client_refuses_bad_options_without_a_call(fp8, needle):
    with AttentionClient("127.0.0.1:9", timeout=1) as c:
        q, k, v = qkv()
        with pytest.raises(InvalidArgument, match=None) as e:
            c.build_request(q, k, v, fp8=fp8)
        assert needle in str(e.value)


def test_valid_formats_are_ignored_outside_fp8(server):
    q, k, v = qkv(1)
    with AttentionClient(server.target) as c:
        plain = c.attend(q, k, v, backend="cpu")
        opts = c.attend(q, k, v, backend="cpu",
                        fp8={"qk_format": "int8_per_token", "pv_format": "16bit",
                             "rotate": False})
    np.testing.assert_array_equal(plain.o, opts.o)
    assert opts.report.backend == "cpu" and opts.report.recipe == ""


def test_impossible_pair_is_invalid_argument(server):
    q, k, v = qkv(2)
    with AttentionClient(server.target) as c:
        with pytest.raises(InvalidArgument) as e:
            c.attend(q, k, v, backend="cpu",
                     fp8={"qk_format": "e4m3_per_tensor", "pv_format": "16bit"})
    assert "PV_16BIT needs qk_format QK_INT8_PER_TOKEN" in str(e.value)


@pytest.mark.parametrize("field, value", [("qk_format", 7), ("pv_format", 9)])
def test_unknown_enum_value_on_the_wire_is_invalid_argument(server, field, value):
    q, k, v = qkv(3)
    with AttentionClient("127.0.0.1:9", timeout=1) as offline:
        req = offline.build_request(q, k, v, backend="cpu")
    setattr(req.fp8, field, value)  # proto3 enums are open: any int reaches the server
    with grpc.insecure_channel(server.target) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.AttentionServiceStub(ch).Attend(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"fp8.{field}: unknown value {value}" in e.value.details()


def test_cpu_only_server_refuses_fp8_with_the_reason(server):
    q, k, v = qkv(4)
    with AttentionClient(server.target) as c:
        with pytest.raises(FailedPrecondition) as e:
            c.attend(q, k, v, backend="fp8", fp8={"qk_format": "int8_per_token"})
    assert "fp8" in str(e.value)

"""CUDA IPC leases (issue 18 item 3, sequence.proto CudaIpcRegion) against a server that cannot
map them: the real attention-server with its KV cache on the CPU (a CPU-only build, or
--kv-device cpu), so this runs in CI without a GPU. Checked: GetServerInfo says CUDA IPC regions
are refused; malformed leases get INVALID_ARGUMENT naming the field before anything else (handle
sizes, offset, bytes, the GPU UUID's form, name and cuda_ipc together); a well-formed lease gets
FAILED_PRECONDITION saying why; nothing is registered and every refusal is counted. Client side:
CudaRegion refuses clearly without torch/CUDA, and the UUID text form is the server's.
The device path itself: test_cuda_ipc_gpu.py (label gpu).
Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_cuda_ipc_leases.py
"""
import os
import sys

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import metrics_testlib as mt  # noqa: E402
import attention_client as ac  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402
from attention_client.cuda_region import format_uuid  # noqa: E402

UUID = "GPU-01234567-89ab-cdef-0123-456789abcdef"


@pytest.fixture(scope="module")
def server():
    s = mt.Server("--kv-device", "cpu")
    yield s
    assert s.close() == 0


@pytest.fixture(scope="module")
def stub(server):
    return spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))


def lease(stub, name="", bytes_=4096, **cuda):
    fields = dict(memory_handle=b"m" * 64, offset=0, device_uuid=UUID, event_handle=b"e" * 64)
    fields.update(cuda)
    req = spb.SharedMemoryLeaseRequest(name=name, bytes=bytes_,
                                       cuda_ipc=spb.CudaIpcRegion(**fields))
    call = stub.SharedMemoryLease(iter([req]), metadata=(("x-attn-identity", "ipc"),),
                                  timeout=30)
    with pytest.raises(grpc.RpcError) as e:
        next(call)
    return e.value.code(), e.value.details()


def counts(server):
    samples, _ = mt.parse(server.scrape())
    lease_codes = {c: mt.value(samples, "attn_requests_total", method="SharedMemoryLease",
                               code=c) for c in ("INVALID_ARGUMENT", "FAILED_PRECONDITION")}
    mapped = {k: mt.value(samples, "attn_shared_memory_" + k) for k in ("regions", "leases")}
    return lease_codes, mapped


def test_server_info_says_cuda_ipc_is_refused(server):
    with ac.AttentionClient(server.target) as c:
        info = c.server_info()
    assert info.cuda_ipc_regions is False
    assert info.kv_cache.device == "cpu"


def test_malformed_leases_are_invalid_argument_naming_the_field(server, stub):
    before, _ = counts(server)
    cases = [
        (dict(memory_handle=b"m" * 63), "cuda_ipc.memory_handle: expected 64 bytes"),
        (dict(event_handle=b"e" * 65), "cuda_ipc.event_handle: expected 64 bytes"),
        (dict(event_handle=b""), "cuda_ipc.event_handle: expected 64 bytes"),
        (dict(offset=-1), "cuda_ipc.offset: expected >= 0"),
        (dict(bytes_=0), "bytes: expected >= 1"),
        (dict(device_uuid="GPU-1234"), "cuda_ipc.device_uuid: expected \"GPU-\""),
        (dict(device_uuid="0"), "cuda_ipc.device_uuid"),
        (dict(name="/attn-both"), "name and cuda_ipc are both set"),
    ]
    for fields, want in cases:
        code, details = lease(stub, **fields)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (fields, code, details)
        assert want in details, (fields, details)
    after, mapped = counts(server)
    assert after["INVALID_ARGUMENT"] == before["INVALID_ARGUMENT"] + len(cases)
    assert mapped == {"regions": 0, "leases": 0}


def test_a_well_formed_lease_is_failed_precondition_saying_why(server, stub):
    before, _ = counts(server)
    for uuid in (UUID, UUID.upper()[4:]):  # either form of the UUID reaches the same refusal
        code, details = lease(stub, device_uuid=uuid)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert "CUDA IPC regions need" in details, details
        assert "built without CUDA" in details or "--kv-device=cpu" in details \
            or "opened none" in details, details
    after, mapped = counts(server)
    assert after["FAILED_PRECONDITION"] == before["FAILED_PRECONDITION"] + 2
    assert mapped == {"regions": 0, "leases": 0}


def test_host_leases_still_work_beside_the_refusals(server):
    with ac.AttentionClient(server.target, identity="ipc") as c:
        with c.shared_region(4096) as region:
            assert region.alive and len(region.region_id) == 32
            _, mapped = counts(server)
            assert mapped == {"regions": 1, "leases": 1}
        assert not region.alive
    _, mapped = counts(server)
    assert mapped == {"regions": 0, "leases": 0}


def test_client_uuid_form_is_the_servers():
    raw = bytes([0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef] * 2)
    assert format_uuid(raw) == UUID  # the vector server/common/gpu_uuid's unit test uses


def test_cuda_region_refuses_clearly_without_torch_cuda(server):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("torch sees a CUDA device here: test_cuda_ipc_gpu.py covers CudaRegion")
    except ImportError:
        pass
    with ac.AttentionClient(server.target) as c:
        with pytest.raises(ac.FailedPrecondition) as e:
            c.cuda_region(1 << 16)
    assert "CudaRegion needs" in str(e.value)

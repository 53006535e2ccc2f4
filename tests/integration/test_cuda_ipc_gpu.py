"""CUDA IPC regions end to end on one GPU (issue 18 item 3; ctest label gpu): this pytest process
is the frontend (torch allocates the region, leases it with CudaRegion), the attention-server
(--kv-device gpu) a second process on the same GPU. Checked:
- GetServerInfo says CUDA IPC regions are accepted and names the GPU's UUID, the one the client
  computes from its own device;
- refusals that need the real CUDA server: another GPU's UUID (FAILED_PRECONDITION), a handle
  CUDA cannot open and a region past the allocation (INVALID_ARGUMENT), nothing registered;
- packed prefill and decode steps through the device region give what the same steps sent as
  bytes give (two twin sequences), both within bf16 tolerance of a float64 reference, o coming
  back as a CUDA tensor; a refused step's o rows are zero on the device, the other step's right;
  a region step's exact retry is refused (never a replay) while the bytes twin replays;
- ExtendBatchStream with two regions in flight;
- close() returns once the server closed its mapping: attn_shared_memory_regions and _leases
  back to 0 at once, the lease counted OK.
Skips (saying why) without torch, without a CUDA device, or without libcuda.
Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q -rs tests/integration/test_cuda_ipc_gpu.py
"""
import ctypes
import os
import sys

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
torch = pytest.importorskip("torch", reason="torch is not installed: CUDA IPC test skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch: CUDA IPC test skipped", allow_module_level=True)
try:
    ctypes.CDLL("libcuda.so.1")
except OSError:
    pytest.skip("no libcuda.so.1: CUDA IPC test skipped", allow_module_level=True)

import metrics_testlib as mt  # noqa: E402
import attention_client as ac  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

N, K, H = 8, 2, 128
DT = torch.bfloat16
DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def server():
    s = mt.Server("--kv-device", "gpu", "--kv-cache-bytes", str(1 << 30), "--log-level", "info")
    yield s
    code = s.stop()
    log = s.read_log()
    s.tmp.cleanup()
    assert code == 0, log[-4000:]


@pytest.fixture(scope="module")
def client(server):
    with ac.AttentionClient(server.target, timeout=60) as c:
        yield c


def gauges(server):
    samples, _ = mt.parse(server.scrape())
    return {k: mt.value(samples, "attn_shared_memory_" + k) for k in ("regions", "leases")}


def oracle(history_q, history_k, history_v, T):
    """float64 bottom-right causal attention of the last T query rows over all keys."""
    q = history_q[-T:].double().cpu()
    k, v = history_k.double().cpu(), history_v.double().cpu()
    S = k.shape[0]
    o = torch.zeros(T, N, H, dtype=torch.float64)
    mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + S - T
    for n in range(N):
        s = q[:, n] @ k[:, n // (N // K)].T / H ** 0.5
        s = s.masked_fill(~mask, float("-inf"))
        o[:, n] = torch.softmax(s, dim=1) @ v[:, n // (N // K)]
    return o


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def pair(client):
    return [client.create_sequence(1, N, K, H, dtype="bfloat16") for _ in range(2)]


def rand(rows, heads, g):
    return torch.randn(rows, heads, H, generator=g, device=DEV).to(DT)


def test_server_accepts_cuda_ipc_on_this_gpu(client):
    info = client.server_info()
    assert info.cuda_ipc_regions, "the server (--kv-device gpu) refuses CUDA IPC regions"
    with client.cuda_region(1 << 16) as region:
        assert info.device_uuid == region.uuid
        assert len(region.region_id) == 32


def lease_error(stub, **cuda):
    """A hand-built lease on `cuda` fields → the grpc.RpcError the server ended it with."""
    req = spb.SharedMemoryLeaseRequest(bytes=cuda.pop("bytes"), cuda_ipc=spb.CudaIpcRegion(**cuda))
    call = stub.SharedMemoryLease(iter([req]), timeout=30)
    with pytest.raises(grpc.RpcError) as e:
        next(call)
    return e.value


def test_refusals_that_need_the_cuda_server(server, client):
    stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
    with client.cuda_region(1 << 16) as region:
        ok_event = region.event.ipc_handle()
        from attention_client.cuda_region import _Driver
        handle, base, size, uuid = _Driver.export(region.buf.data_ptr(), DEV.index)
        other = "GPU-00000000-0000-0000-0000-000000000000"
        e = lease_error(stub, memory_handle=handle, device_uuid=other, event_handle=ok_event,
                        bytes=16)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and other in e.details()
        e = lease_error(stub, memory_handle=os.urandom(64), device_uuid=uuid,
                        event_handle=ok_event, bytes=16)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cudaIpcOpenMemHandle" in e.details(), e.details()
        e = lease_error(stub, memory_handle=handle, device_uuid=uuid, event_handle=ok_event,
                        offset=size - 8, bytes=16)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "beyond the allocation" in e.details(), e.details()
        assert gauges(server) == {"regions": 1, "leases": 1}  # only the region's own lease


def test_packed_steps_through_the_region_equal_the_bytes_path(server, client):
    g = torch.Generator(device=DEV).manual_seed(18)
    dev, ref = pair(client), pair(client)
    lens = [5, 3]
    hist = [[torch.empty(0, n, H, device=DEV, dtype=DT) for n in (N, K, K)] for _ in lens]
    with client.cuda_region(4 << 20) as region:
        for step in range(5):
            ts = lens if step == 0 else [1, 1]
            q, k, v = rand(sum(ts), N, g), rand(sum(ts), K, g), rand(sum(ts), K, g)
            r_dev = client.extend_packed(0, [(s, None, t) for s, t in zip(dev, ts)], q, k, v,
                                         region=region)
            r_ref = client.extend_packed(0, [(s, None, t) for s, t in zip(ref, ts)], q, k, v)
            assert all(isinstance(x, ac.StepResult) for x in r_dev.steps + r_ref.steps)
            assert not any(x.replayed for x in r_dev.steps)
            assert r_dev.o.is_cuda and r_dev.o.device == DEV and r_dev.o.dtype == DT
            assert rel(r_dev.o, r_ref.o) < 1e-3, (step, rel(r_dev.o, r_ref.o))
            row = 0
            for b, t in enumerate(ts):
                for i, x in enumerate((q, k, v)):
                    hist[b][i] = torch.cat([hist[b][i], x[row:row + t]])
                want = oracle(*hist[b], t)
                assert rel(r_dev.o[row:row + t], want) < 1e-2
                row += t
        # One refused step (a stale position): its rows are zeros on the device.
        q, k, v = rand(2, N, g), rand(2, K, g), rand(2, K, g)
        bad = client.extend_packed(0, [(dev[0], 0, 1), (dev[1], None, 1)], q, k, v,
                                   region=region)
        good = client.extend_packed(0, [(ref[1], None, 1)], q[1:], k[1:], v[1:])
        assert isinstance(bad.steps[0], ac.FailedPrecondition)
        assert torch.count_nonzero(bad.o[0]) == 0
        assert rel(bad.o[1:], good.o) < 1e-3
        # An exact retry of a region step is refused; the bytes twin's is a replay.
        last = dev[1].layer_lengths[0] - 1
        again = client.extend_packed(0, [(dev[1], last, 1)], q[1:], k[1:], v[1:],
                                     region=region)
        assert isinstance(again.steps[0], ac.FailedPrecondition)
        assert f"length {last + 1}" in str(again.steps[0])
        replay = client.extend_packed(0, [(ref[1], last, 1)], q[1:], k[1:], v[1:])
        assert replay.steps[0].replayed
        assert gauges(server)["regions"] >= 1
    assert gauges(server) == {"regions": 0, "leases": 0}  # closed when close() returned


def test_two_regions_in_flight_on_a_batch_stream(server, client):
    g = torch.Generator(device=DEV).manual_seed(5)
    dev, ref = pair(client), pair(client)
    q, k, v = rand(8, N, g), rand(8, K, g), rand(8, K, g)
    client.extend_packed(0, [(s, 0, 4) for s in dev], q, k, v)
    client.extend_packed(0, [(s, 0, 4) for s in ref], q, k, v)
    with client.cuda_region(1 << 20) as r1, client.cuda_region(1 << 20) as r2, \
            client.batch_stream(max_in_flight=2) as bs:
        for _ in range(3):
            q, k, v = rand(2, N, g), rand(2, K, g), rand(2, K, g)
            f1 = bs.submit(0, [(dev[0], None, 1)], q[:1], k[:1], v[:1], region=r1)
            f2 = bs.submit(0, [(dev[1], None, 1)], q[1:], k[1:], v[1:], region=r2)
            o = torch.cat([f1.result(60).o, f2.result(60).o])
            want = client.extend_packed(0, [(s, None, 1) for s in ref], q, k, v).o
            assert rel(o, want) < 1e-3
    samples, _ = mt.parse(server.scrape())
    assert mt.value(samples, "attn_requests_total", method="SharedMemoryLease", code="OK") >= 2
    assert gauges(server) == {"regions": 0, "leases": 0}

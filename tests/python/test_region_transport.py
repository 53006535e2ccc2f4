"""attention_client.region_transport.RegionTransport (attach(..., transport_region=)) with no
server, GPU or torch: a fake client's GetServerInfo, fake leases and a fake UUID lookup.
Checked: "cuda" refuses (FailedPrecondition saying why) tensors off CUDA, a server without CUDA
IPC regions, another GPU, an unreadable UUID, and raises a failed lease; "auto" returns None
for those instead, warns once per reason and keeps the first in `fallback`, and does not retry
a lease that failed; GetServerInfo is asked once; a region is leased at the first call,
reused while calls fit, replaced (the old one closed first) by one rounded up to 1 MiB when
a call does not fit or the lease died; close() is idempotent; region_bytes is the region
layout's size.
Run: PYTHONPATH=client/python python3 -m pytest -q tests/python/test_region_transport.py
"""
import os
import sys
import types
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from attention_client.errors import FailedPrecondition, InvalidArgument  # noqa: E402
from attention_client.errors import ResourceExhausted  # noqa: E402
from attention_client.region_transport import RegionTransport, region_bytes  # noqa: E402

UUID = "GPU-0123abcd-0000-1111-2222-333344445555"
OTHER = "GPU-ffffffff-0000-1111-2222-333344445555"
MiB = 1 << 20


class Device(types.SimpleNamespace):
    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


CUDA0, CUDA1, CPU = Device(type="cuda", index=0), Device(type="cuda", index=1), \
    Device(type="cpu", index=None)


class Client:
    def __init__(self, accepts=True, uuid=UUID):
        self.info = types.SimpleNamespace(cuda_ipc_regions=accepts, device_uuid=uuid)
        self.info_calls = 0

    def server_info(self):
        self.info_calls += 1
        return self.info


class Region:
    def __init__(self, log, nbytes, device):
        self.log, self.nbytes, self.device, self.alive = log, nbytes, device, True
        log.append(("lease", nbytes))

    def close(self):
        if self.alive:
            self.log.append(("close", self.nbytes))
        self.alive = False


def transport(mode, client=None, fail=None, uuids=None):
    log = []

    def lease(nbytes, device):
        if fail is not None:
            log.append(("refused", nbytes))
            raise fail
        return Region(log, nbytes, device)

    def uuid_of(device):
        u = (uuids or {0: UUID, 1: OTHER}).get(device.index)
        if isinstance(u, Exception):
            raise u
        return u
    t = RegionTransport(client or Client(), mode, lease=lease, uuid_of=uuid_of)
    return t, log


def test_cuda_refuses_saying_why():
    t, _ = transport("cuda")
    with pytest.raises(FailedPrecondition, match="on cpu, not on a CUDA device"):
        t.check(CPU)
    with pytest.raises(FailedPrecondition, match=f"cuda:1 \\({OTHER}\\).*computes on {UUID}"):
        t.region_for(CUDA1, 100)
    assert t.check(CUDA0) is None
    t, _ = transport("cuda", Client(accepts=False))
    with pytest.raises(FailedPrecondition, match="cuda_ipc_regions is false.*'auto'"):
        t.check(CUDA0)
    t, _ = transport("cuda", uuids={0: FailedPrecondition("no libcuda.so.1")})
    with pytest.raises(FailedPrecondition, match="UUID of cuda:0 cannot be read.*libcuda"):
        t.check(CUDA0)
    assert t.fallback is None and t.region is None


def test_auto_falls_back_visibly_once_per_reason():
    client = Client()
    t, log = transport("auto", client)
    with pytest.warns(RuntimeWarning, match="sends q/k/v/o as bytes: the layer call's tensors "
                                            "are on cpu"):
        assert t.region_for(CPU, 100) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: no second warning
        assert t.check(CPU) is not None and t.region_for(CPU, 100) is None
    with pytest.warns(RuntimeWarning, match="CUDA IPC needs the same GPU"):
        assert t.region_for(CUDA1, 100) is None
    assert t.fallback.startswith("the layer call's tensors are on cpu")  # the first reason
    assert t.region_for(CUDA0, 100) is not None  # the server's GPU still goes through a region
    assert client.info_calls == 1 and log == [("lease", MiB)]
    t, log = transport("auto", Client(accepts=False))
    with pytest.warns(RuntimeWarning, match="cuda_ipc_regions is false"):
        assert t.region_for(CUDA0, 100) is None
    assert log == [] and "cuda_ipc_regions" in t.fallback


def test_lease_failure():
    t, log = transport("auto", fail=InvalidArgument("cudaIpcOpenMemHandle failed"))
    with pytest.warns(RuntimeWarning, match="leasing a 1048576-byte CUDA IPC region on cuda:0 "
                                            "failed.*cudaIpcOpenMemHandle"):
        assert t.region_for(CUDA0, 100) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert t.region_for(CUDA0, 100) is None  # not retried, not warned again
    assert log == [("refused", MiB)] and "cudaIpcOpenMemHandle" in t.fallback
    t, log = transport("cuda", fail=ResourceExhausted("--max-shared-memory-bytes"))
    for _ in range(2):  # raised as it is, and tried again at the next call
        with pytest.raises(ResourceExhausted):
            t.region_for(CUDA0, 100)
    assert log == [("refused", MiB)] * 2 and t.leases == 0


def test_sized_for_the_largest_call_grown_by_re_leasing():
    t, log = transport("cuda")
    r = t.region_for(CUDA0, 1000)
    assert r.nbytes == MiB and t.region_for(CUDA0, MiB) is r and t.region_for(CUDA0, 1) is r
    r2 = t.region_for(CUDA0, 3 * MiB + 1)
    assert r2.nbytes == 4 * MiB and not r.alive
    assert t.region_for(CUDA0, 2 * MiB) is r2  # smaller calls keep the bigger region
    r2.alive = False  # the lease ended (e.g. the server restarted): replaced at the next call
    r3 = t.region_for(CUDA0, 10)
    assert r3 is not r2 and r3.nbytes == MiB and t.leases == 3
    assert log == [("lease", MiB), ("close", MiB), ("lease", 4 * MiB), ("lease", MiB)]
    t.close()
    t.close()
    assert not r3.alive and t.region is None and log[-1] == ("close", MiB)


def test_region_bytes_is_the_layout_size_and_modes():
    # q (3, 4, 8) fp16 192 B, k and v (3, 2, 8) 96 B each padded to 128, o 192 B
    assert region_bytes(3, 4, 2, 8, 2) == 192 + 128 + 128 + 192
    with pytest.raises(ValueError, match="None, 'cuda' or 'auto'"):
        RegionTransport(Client(), "bytes")

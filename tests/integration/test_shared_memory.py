"""Host shared-memory leases (issue 18, sequence.proto SharedMemoryLease) against the real
attention-server (cpu) on loopback: a region id per lease (32 lowercase hex), the refusals
(no such object: NOT_FOUND; too small, bad name, not a regular file: INVALID_ARGUMENT; the
--max-shared-memory-* limits: RESOURCE_EXHAUSTED), later messages ignored, and the region
released when the lease ends however it ends (the client closes, cancels, or is killed with
SIGKILL; the drain ends open leases and refuses new ones; a revoked token ends its identity's
leases), seen in the attn_shared_memory_* gauges and attn_requests_total.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_shared_memory.py
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import metrics_testlib as mt  # noqa: E402
from shm_testlib import Lease, ShmObject  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

REGION_ID = re.compile(r"^[0-9a-f]{32}$")


def gauges(server):
    samples, _ = mt.parse(server.scrape())
    return {k: mt.value(samples, "attn_shared_memory_" + k)
            for k in ("regions", "bytes", "leases", "broken_total")}


def lease_count(server, code):
    samples, _ = mt.parse(server.scrape())
    return mt.value(samples, "attn_requests_total", method="SharedMemoryLease", code=code)


def wait_for(what, fn, timeout_s=30.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError("never happened: " + what)


def refused(stub, name, size, who=""):
    lease = Lease(stub, name, size, who)
    with pytest.raises(grpc.RpcError) as e:
        lease.region()
    return e.value


@pytest.fixture
def server():
    s = mt.Server()
    yield s
    assert s.close() == 0


def test_a_lease_maps_the_object_and_answers_a_region_id(server):
    stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
    assert gauges(server) == {"regions": 0, "bytes": 0, "leases": 0, "broken_total": 0}
    with ShmObject(65536) as obj:
        a = Lease(stub, obj.name, 65536, "alice")
        b = Lease(stub, obj.name, 4096, "alice")  # one object, two regions
        ra, rb = a.region(), b.region()
        assert REGION_ID.match(ra.region_id) and REGION_ID.match(rb.region_id)
        assert ra.region_id != rb.region_id
        assert (ra.bytes, rb.bytes) == (65536, 4096)
        assert gauges(server) == {"regions": 2, "bytes": 65536 + 4096, "leases": 2,
                                  "broken_total": 0}
        assert a.close() == grpc.StatusCode.OK
        assert b.close() == grpc.StatusCode.OK
    wait_for("regions released", lambda: gauges(server)["regions"] == 0)
    assert gauges(server) == {"regions": 0, "bytes": 0, "leases": 0, "broken_total": 0}
    wait_for("both leases counted", lambda: lease_count(server, "OK") == 2)


def test_refusals(server):
    stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
    with ShmObject(4096) as obj:
        e = refused(stub, f"/attn-it-{os.getpid()}-no-such-object", 16)
        assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()
        e = refused(stub, obj.name, 4097)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "4096 bytes, fewer than the 4097" in e.details()
        for name, size in (("no-slash", 16), ("/a/b", 16), ("/..", 16), ("/" + "x" * 201, 16),
                           (obj.name, 0), (obj.name, -1)):
            e = refused(stub, name, size)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, size, e.details())
        directory = f"/attn-it-dir-{os.getpid()}"
        os.mkdir("/dev/shm" + directory)
        try:
            e = refused(stub, directory, 16)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        finally:
            os.rmdir("/dev/shm" + directory)
    assert gauges(server)["regions"] == 0
    wait_for("refusals counted", lambda: lease_count(server, "INVALID_ARGUMENT") == 8)
    assert lease_count(server, "NOT_FOUND") == 1


def test_later_messages_are_ignored(server):
    stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
    with ShmObject(4096) as obj:
        lease = Lease(stub, obj.name, 4096)
        first = lease.region()
        for _ in range(3):
            lease.send("no-slash", 0)  # would be refused as a first message
        lease.send(obj.name, 4096)
        assert lease.close() == grpc.StatusCode.OK  # no second response, no error
        assert REGION_ID.match(first.region_id)
    wait_for("region released", lambda: gauges(server)["regions"] == 0)


def test_limits_on_regions_and_bytes():
    server = mt.Server("--max-shared-memory-regions", "2", "--max-shared-memory-bytes", "12K")
    try:
        stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
        with ShmObject(8192) as obj:
            a = Lease(stub, obj.name, 8192, "alice")
            b = Lease(stub, obj.name, 4096, "bob")  # the limits count every identity
            a.region(), b.region()
            e = refused(stub, obj.name, 1, "carol")
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-shared-memory-regions" in e.details()
            assert b.close() == grpc.StatusCode.OK
            wait_for("b released", lambda: gauges(server)["regions"] == 1)
            e = refused(stub, obj.name, 4097, "carol")
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-shared-memory-bytes" in e.details()
            c = Lease(stub, obj.name, 4096, "carol")
            assert c.region().bytes == 4096
            assert gauges(server)["bytes"] == 12288
            a.close(), c.close()
        wait_for("all released", lambda: gauges(server)["regions"] == 0)
    finally:
        assert server.close() == 0


def test_a_cancelled_lease_releases_its_region(server):
    stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
    with ShmObject(4096) as obj:
        lease = Lease(stub, obj.name, 4096)
        lease.region()
        assert gauges(server)["leases"] == 1
        lease.cancel()
        wait_for("region released", lambda: gauges(server)["regions"] == 0)
        wait_for("counted CANCELLED", lambda: lease_count(server, "CANCELLED") == 1)


CHILD = r"""
import sys, time
sys.path[:0] = sys.argv[1:3]
import grpc
from shm_testlib import Lease
from attention_client._pb import sequence_pb2_grpc as spb_grpc
stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(sys.argv[3]))
lease = Lease(stub, sys.argv[4], 4096, "child")
print(lease.region().region_id, flush=True)
time.sleep(600)
"""


def test_a_killed_client_releases_its_region(server):
    with ShmObject(4096) as obj:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, HERE, os.path.join(ROOT, "client", "python"),
             server.target, obj.name], stdout=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline().strip()
            assert REGION_ID.match(line), line
            assert gauges(server)["leases"] == 1
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            wait_for("the dead client's region released",
                     lambda: gauges(server)["regions"] == 0)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert server.proc.poll() is None


def test_the_drain_refuses_new_leases_and_ends_open_ones():
    server = mt.Server("--drain-wait-sequences", "--drain-timeout-s", "60")
    channel = grpc.insecure_channel(server.target)
    stub = spb_grpc.SequenceServiceStub(channel)
    seq = stub.CreateSequence(spb.CreateSequenceRequest(
        num_layers=1, num_kv_heads=1, head_dim=8, num_heads=1, dtype=pb.FLOAT32),
        timeout=10).sequence.sequence_id  # holds the drain open
    with ShmObject(4096) as obj:
        open_lease = Lease(stub, obj.name, 4096)
        open_lease.region()
        server.proc.send_signal(signal.SIGTERM)

        def new_lease_refused():
            lease = Lease(stub, obj.name, 4096)
            try:
                lease.region()
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
                return True
            lease.close()
            return False

        wait_for("a new lease refused while draining", new_lease_refused)
        assert not open_lease.call.done()  # served until the drain ends
        stub.ReleaseSequence(spb.ReleaseSequenceRequest(sequence_id=seq), timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            next(open_lease.call)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in e.value.details()
        assert server.proc.wait(timeout=60) == 0
    channel.close()
    server.close()


def test_a_revoked_token_ends_its_identitys_leases():
    alice, bob = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
    with tempfile.TemporaryDirectory() as tmp:
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            f.write(f"alice {alice}\nbob {bob}\n")
        server = mt.Server("--auth-token-file", tokens)
        try:
            stub = spb_grpc.SequenceServiceStub(grpc.insecure_channel(server.target))
            with ShmObject(4096) as obj:
                leases = {who: Lease(stub, obj.name, 4096,
                                     metadata=(("authorization", "Bearer " + token),))
                          for who, token in (("alice", alice), ("bob", bob))}
                for lease in leases.values():
                    lease.region()
                with open(tokens, "w") as f:
                    f.write(f"bob {bob}\n")
                server.proc.send_signal(signal.SIGHUP)
                with pytest.raises(grpc.RpcError) as e:
                    next(leases["alice"].call)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                wait_for("alice's region released", lambda: gauges(server)["regions"] == 1)
                assert not leases["bob"].call.done()
                assert leases["bob"].close() == grpc.StatusCode.OK
        finally:
            assert server.close() == 0

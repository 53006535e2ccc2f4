"""A packed ExtendBatch through host shared memory (issue 18: PackedExtendBatch.q_region, k_region,
v_region, o_region) against the real attention-server (cpu) on loopback: the result equals the
same batch with inline bytes (bitwise), o lands in o_region (the response's o carries dtype and
shape only), also on ExtendBatchStream, bad slices are refused with nothing changed
(INVALID_ARGUMENT, also for an o_region overlapping an input; another identity's, a released or
an unknown region: NOT_FOUND), and a client that truncates its object under the server gets
FAILED_PRECONDITION while the server stays up and serves others.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_shared_memory_packed.py
"""
import os
import sys

import grpc
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_proc import ServerProc  # noqa: E402
from shm_testlib import Lease, ShmObject, identity  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

N, K, H = 4, 2, 16
TOKENS = (3, 1, 2)  # query tokens of the batch's steps
TOTAL = sum(TOKENS)
Q_BYTES = TOTAL * N * H * 4
KV_BYTES = TOTAL * K * H * 4
# The region's layout: q, k, v, then o, each 64-byte aligned after a 128-byte gap at the start.
Q_AT = 128
K_AT = Q_AT + Q_BYTES
V_AT = K_AT + KV_BYTES
O_AT = V_AT + KV_BYTES
REGION_BYTES = 65536


def tensor(shape, data=b""):
    return pb.Tensor(dtype=pb.FLOAT32, shape=list(shape), data=data)


def inputs(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((TOTAL, N, H)).astype(np.float32),
            rng.standard_normal((TOTAL, K, H)).astype(np.float32),
            rng.standard_normal((TOTAL, K, H)).astype(np.float32))


def create(stub, who, count=len(TOKENS)):
    return [stub.CreateSequence(spb.CreateSequenceRequest(
        num_layers=1, num_kv_heads=K, head_dim=H, num_heads=N, dtype=pb.FLOAT32),
        metadata=identity(who), timeout=10).sequence.sequence_id for _ in range(count)]


def lengths(stub, ids, who):
    return [stub.GetSequence(spb.GetSequenceRequest(sequence_id=i), metadata=identity(who),
                             timeout=10).sequence.layer_lengths[0] for i in ids]


def steps(ids, position=0):
    return [spb.PackedStep(sequence_id=i, position=position, query_tokens=t)
            for i, t in zip(ids, TOKENS)]


def inline_batch(ids, q, k, v, position=0):
    return spb.ExtendBatchRequest(packed=spb.PackedExtendBatch(
        layer=0, steps=steps(ids, position), q=tensor(q.shape, q.tobytes()),
        k=tensor(k.shape, k.tobytes()), v=tensor(v.shape, v.tobytes())))


def region_batch(ids, region_id, position=0, **overrides):
    """The batch with q/k/v/o in the region at the layout above; `overrides` replaces slices."""
    def piece(name, offset, size):
        s = overrides.get(name, (region_id, offset, size))
        return spb.RegionSlice(region_id=s[0], offset=s[1], bytes=s[2])

    return spb.ExtendBatchRequest(packed=spb.PackedExtendBatch(
        layer=0, steps=steps(ids, position), q=tensor((TOTAL, N, H)), k=tensor((TOTAL, K, H)),
        v=tensor((TOTAL, K, H)), q_region=piece("q", Q_AT, Q_BYTES),
        k_region=piece("k", K_AT, KV_BYTES), v_region=piece("v", V_AT, KV_BYTES),
        o_region=piece("o", O_AT, Q_BYTES)))


def fill(obj, q, k, v):
    obj.view[Q_AT:Q_AT + Q_BYTES] = q.tobytes()
    obj.view[K_AT:K_AT + KV_BYTES] = k.tobytes()
    obj.view[V_AT:V_AT + KV_BYTES] = v.tobytes()


@pytest.fixture
def served():
    with ServerProc() as server, ShmObject(REGION_BYTES) as obj:
        stub = spb_grpc.SequenceServiceStub(server.channel)
        lease = Lease(stub, obj.name, REGION_BYTES, "alice")
        region = lease.region().region_id
        yield server, stub, obj, region
        lease.cancel()


def test_shared_memory_equals_inline_bytes(served):
    server, stub, obj, region = served
    q, k, v = inputs(1)
    inline_ids, shm_ids = create(stub, "alice"), create(stub, "alice")
    want = stub.ExtendBatch(inline_batch(inline_ids, q, k, v), metadata=identity("alice"),
                            timeout=30)
    fill(obj, q, k, v)
    got = stub.ExtendBatch(region_batch(shm_ids, region), metadata=identity("alice"),
                           timeout=30)
    assert [s.code for s in want.steps] == [0] * len(TOKENS)
    assert [s.code for s in got.steps] == [0] * len(TOKENS), [s.message for s in got.steps]
    assert [s.length for s in got.steps] == list(TOKENS)
    assert got.o.dtype == pb.FLOAT32 and list(got.o.shape) == [TOTAL, N, H]
    assert got.o.data == b""  # o went into o_region
    assert bytes(obj.view[O_AT:O_AT + Q_BYTES]) == want.o.data  # bitwise
    assert lengths(stub, shm_ids, "alice") == list(TOKENS)


@pytest.mark.parametrize("name,override,code", [
    ("q", lambda r: (r, REGION_BYTES - 64, Q_BYTES), grpc.StatusCode.INVALID_ARGUMENT),
    ("k", lambda r: (r, -1, KV_BYTES), grpc.StatusCode.INVALID_ARGUMENT),
    ("v", lambda r: (r, V_AT, KV_BYTES - 4), grpc.StatusCode.INVALID_ARGUMENT),
    ("o", lambda r: (r, 2 ** 62, Q_BYTES), grpc.StatusCode.INVALID_ARGUMENT),
    ("o", lambda r: (r, 0, 0), grpc.StatusCode.INVALID_ARGUMENT),
    ("q", lambda r: ("0" * 32, Q_AT, Q_BYTES), grpc.StatusCode.NOT_FOUND),
    ("k", lambda r: ("not-a-region-id", K_AT, KV_BYTES), grpc.StatusCode.NOT_FOUND),
    ("o", lambda r: (r, Q_AT + 64, Q_BYTES), grpc.StatusCode.INVALID_ARGUMENT),  # overlaps q
])
def test_bad_slices_are_refused_and_change_nothing(served, name, override, code):
    server, stub, obj, region = served
    ids = create(stub, "alice")
    fill(obj, *inputs(2))
    obj.view[O_AT:O_AT + 8] = b"\x5a" * 8
    with pytest.raises(grpc.RpcError) as e:
        stub.ExtendBatch(region_batch(ids, region, **{name: override(region)}),
                         metadata=identity("alice"), timeout=30)
    assert e.value.code() == code, e.value.details()
    assert e.value.details().startswith(f"packed.{name}_region: "), e.value.details()
    assert lengths(stub, ids, "alice") == [0] * len(TOKENS)
    assert bytes(obj.view[O_AT:O_AT + 8]) == b"\x5a" * 8  # o_region untouched


def test_extend_batch_stream_through_shared_memory(served):
    server, stub, obj, region = served
    q, k, v = inputs(5)
    want = stub.ExtendBatch(inline_batch(create(stub, "alice"), q, k, v),
                            metadata=identity("alice"), timeout=30)
    fill(obj, q, k, v)
    ids = create(stub, "alice")
    first = region_batch(ids, region)
    first.tag = 7
    bad = region_batch(create(stub, "alice"), "f" * 32)
    bad.tag = 8
    replies = {r.tag: r for r in stub.ExtendBatchStream(iter([first, bad]),
                                                        metadata=identity("alice"), timeout=30)}
    assert replies[7].code == 0 and [s.code for s in replies[7].steps] == [0] * len(TOKENS)
    assert bytes(obj.view[O_AT:O_AT + Q_BYTES]) == want.o.data
    assert replies[8].code == grpc.StatusCode.NOT_FOUND.value[0]
    assert replies[8].message.startswith("packed.q_region: ")


def test_data_and_a_region_together_are_refused(served):
    server, stub, obj, region = served
    ids = create(stub, "alice")
    request = region_batch(ids, region)
    request.packed.q.data = b"\0" * Q_BYTES
    with pytest.raises(grpc.RpcError) as e:
        stub.ExtendBatch(request, metadata=identity("alice"), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert lengths(stub, ids, "alice") == [0] * len(TOKENS)


def test_another_identitys_region_is_not_found(served):
    server, stub, obj, region = served
    bob_ids = create(stub, "bob")
    with pytest.raises(grpc.RpcError) as e:
        stub.ExtendBatch(region_batch(bob_ids, region), metadata=identity("bob"), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ExtendBatch(region_batch(bob_ids, "f" * 32), metadata=identity("bob"), timeout=30)
    assert unknown.value.details() == e.value.details().replace(region, "f" * 32)
    assert lengths(stub, bob_ids, "bob") == [0] * len(TOKENS)


def test_a_released_region_is_not_found():
    with ServerProc() as server, ShmObject(REGION_BYTES) as obj:
        stub = spb_grpc.SequenceServiceStub(server.channel)
        lease = Lease(stub, obj.name, REGION_BYTES, "alice")
        region = lease.region().region_id
        assert lease.close() == grpc.StatusCode.OK
        ids = create(stub, "alice")
        with pytest.raises(grpc.RpcError) as e:
            stub.ExtendBatch(region_batch(ids, region), metadata=identity("alice"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_truncated_object_fails_the_call_and_the_server_serves_on(served):
    server, stub, obj, region = served
    ids = create(stub, "alice")
    fill(obj, *inputs(3))
    obj.truncate(0)  # the hostile client's move: every page the server touches now faults
    with pytest.raises(grpc.RpcError) as e:
        stub.ExtendBatch(region_batch(ids, region), metadata=identity("alice"), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "shrank below its registered size" in e.value.details()
    assert server.alive()
    with pytest.raises(grpc.RpcError) as again:  # the region stays broken
        stub.ExtendBatch(region_batch(create(stub, "alice"), region),
                         metadata=identity("alice"), timeout=30)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Others are served: a fresh region of another identity, and inline bytes.
    with ShmObject(REGION_BYTES) as other:
        lease = Lease(stub, other.name, REGION_BYTES, "bob")
        bob_region = lease.region().region_id
        q, k, v = inputs(4)
        fill(other, q, k, v)
        bob_ids = create(stub, "bob")
        r = stub.ExtendBatch(region_batch(bob_ids, bob_region), metadata=identity("bob"),
                             timeout=30)
        assert [s.code for s in r.steps] == [0] * len(TOKENS)
        want = stub.ExtendBatch(inline_batch(create(stub, "bob"), q, k, v),
                                metadata=identity("bob"), timeout=30)
        assert bytes(other.view[O_AT:O_AT + Q_BYTES]) == want.o.data
        lease.close()

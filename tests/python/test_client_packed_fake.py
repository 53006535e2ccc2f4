"""BatchStream and SharedRegion against a scripted in-process SequenceService (no attention-server):
what only a server that answers in a chosen order can show deterministically.

The fake computes o = 2·q per row (float32), answers each step with length position + T (and
refuses position 13 with FAILED_PRECONDITION), refuses layer 99 at request level; its
ExtendBatchStream holds a request of tag >= 100 until it has answered the next one (replies
out of order), aborts the stream on layer 66; its
SharedMemoryLease maps the client's /dev/shm object and records when the lease ends.
Checked: replies matched by tag whatever their order, a request-level error raised on that
batch's future only (the stream goes on), a failing stream failing its pending futures and
later submits, the max_in_flight bound, SharedRegion inline = region results, lease ended and
name unlinked by close(), and the wire and protobuf paths of both.
Run: PYTHONPATH=client/python python3 -m pytest -q tests/python/test_client_packed_fake.py
"""
import asyncio
import concurrent.futures
import mmap
import os
import sys
import threading

import grpc
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402
from attention_client.sequence import Sequence  # noqa: E402


class Fake(spb_grpc.SequenceServiceServicer):
    def __init__(self):
        self.regions = {}   # region_id → (mmap, name)
        self.ended = []     # names whose lease stream ended
        self.lock = threading.Lock()

    def _tensor(self, t, region):
        if region.region_id:
            mm = self.regions[region.region_id][0]
            raw = mm[region.offset:region.offset + region.bytes]
        else:
            raw = t.data
        return np.frombuffer(raw, dtype="<f4").reshape(tuple(t.shape))

    def _answer(self, req):
        pk = req.packed
        resp = spb.ExtendBatchResponse(tag=req.tag)
        if pk.layer == 99:
            resp.code, resp.message = grpc.StatusCode.INVALID_ARGUMENT.value[0], \
                "layer 99 outside [0, 3)"
            return resp
        for s in pk.steps:
            if s.position == 13:
                resp.steps.add(code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                               message=f"position 13: layer length is {s.position - 1}")
            else:
                resp.steps.add(length=s.position + s.query_tokens, kv_len=s.position + 1)
        resp.report.batch_size = len(pk.steps)
        if pk.append_only:
            return resp
        q = self._tensor(pk.q, pk.q_region)
        o = 2 * q
        row = 0
        for s, r in zip(pk.steps, resp.steps):
            if r.code:
                o[row:row + s.query_tokens] = 0
            row += s.query_tokens
        resp.o.dtype = pb.FLOAT32
        resp.o.shape.extend(q.shape)
        if pk.o_region.region_id:
            mm = self.regions[pk.o_region.region_id][0]
            mm[pk.o_region.offset:pk.o_region.offset + o.nbytes] = o.astype("<f4").tobytes()
        else:
            resp.o.data = o.astype("<f4").tobytes()
        return resp

    def ExtendBatch(self, request, context):
        return self._answer(request)

    def ExtendBatchStream(self, request_iterator, context):
        held = None
        for req in request_iterator:
            if req.packed.layer == 66:
                context.abort(grpc.StatusCode.UNAVAILABLE, "server going away")
            if req.tag >= 100 and held is None:
                held = req  # answered after the next request's reply
                continue
            yield self._answer(req)
            if held is not None:
                yield self._answer(held)
                held = None
        if held is not None:
            yield self._answer(held)

    def SharedMemoryLease(self, request_iterator, context):
        first = next(request_iterator)
        fd = os.open("/dev/shm/" + first.name.lstrip("/"), os.O_RDWR)
        mm = mmap.mmap(fd, first.bytes)
        os.close(fd)
        rid = os.urandom(16).hex()
        with self.lock:
            self.regions[rid] = (mm, first.name)
        yield spb.SharedMemoryLeaseResponse(region_id=rid, bytes=first.bytes)
        for _ in request_iterator:
            pass
        with self.lock:
            self.ended.append(first.name)


@pytest.fixture(scope="module")
def fake():
    f = Fake()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    spb_grpc.add_SequenceServiceServicer_to_server(f, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f, f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture(params=["wire", "protobuf"])
def client(fake, request):
    with AttentionClient(fake[1], timeout=30) as c:
        c.wire = request.param == "wire"
        yield c


def handle(client, i):
    return Sequence(client, spb.SequenceInfo(sequence_id=f"{i:032x}", num_layers=3,
                                             dtype=pb.FLOAT32, layer_lengths=[0, 0, 0]))


def batch(rng, rows):
    return (rng.standard_normal((rows, 4, 8)).astype(np.float32),
            rng.standard_normal((rows, 2, 8)).astype(np.float32),
            rng.standard_normal((rows, 2, 8)).astype(np.float32))


def test_replies_out_of_order_matched_by_tag(client):
    rng = np.random.default_rng(1)
    a, b = handle(client, 1), handle(client, 2)
    qa, ka, va = batch(rng, 3)
    qb, kb, vb = batch(rng, 5)
    order = []
    with client.batch_stream(max_in_flight=2) as bs:
        fa = bs.submit(0, [(a, None, 3)], qa, ka, va, tag=100,
                       callback=lambda f: order.append(f.result().tag))
        fb = bs.submit(0, [(b, None, 2), (a, 3, 3)], qb, kb, vb, tag=200,
                       callback=lambda f: order.append(f.result().tag))
        ra, rb = fa.result(10), fb.result(10)
    assert order == [200, 100]  # the fake answered b first
    assert ra.tag == 100 and rb.tag == 200
    np.testing.assert_array_equal(ra.o, 2 * qa)
    np.testing.assert_array_equal(rb.o, 2 * qb)
    assert [s.length for s in rb.steps] == [2, 6]
    assert a.layer_lengths[0] == 6 and b.layer_lengths[0] == 2  # never lowered by a's reply


def test_request_level_error_fails_that_batch_only(client):
    rng = np.random.default_rng(2)
    a, b = handle(client, 3), handle(client, 4)
    with client.batch_stream(max_in_flight=2) as bs:
        f_ok = bs.submit(0, [(a, 0, 2)], *batch(rng, 2))
        f_bad = bs.submit(99, [(b, 0, 2)], *batch(rng, 2))
        with pytest.raises(ac.InvalidArgument, match="layer 99"):
            f_bad.result(10)
        assert f_ok.result(10).steps[0].length == 2
        q, k, v = batch(rng, 1)
        r = bs.extend(0, [(a, 2, 1), (b, 13, 1)], np.concatenate([q, q]),
                      np.concatenate([k, k]), np.concatenate([v, v]), timeout=10)
        assert isinstance(r.steps[1], ac.FailedPrecondition)
        np.testing.assert_array_equal(r.o, np.concatenate([2 * q, 0 * q]))


def test_auto_tags_bound_and_stream_failure(client):
    rng = np.random.default_rng(3)
    seqs = [handle(client, 10 + i) for i in range(4)]
    bs = client.batch_stream(max_in_flight=1)
    try:
        f1 = bs.submit(0, [(seqs[0], 0, 1)], *batch(rng, 1))
        assert f1.result(10).tag == 1
        f2 = bs.submit(0, [(seqs[1], 0, 1)], *batch(rng, 1))
        assert f2.result(10).tag == 2 and bs.in_flight == 0
        with pytest.raises(ac.InvalidArgument, match="tag must be a uint64"):
            bs.submit(0, [(seqs[2], 0, 1)], *batch(rng, 1), tag=-1)
        f3 = bs.submit(66, [(seqs[2], 0, 1)], *batch(rng, 1))  # the fake aborts the stream
        with pytest.raises(ac.Unavailable, match="going away"):
            f3.result(10)
        with pytest.raises(ac.Unavailable):
            bs.submit(0, [(seqs[3], 0, 1)], *batch(rng, 1))
    finally:
        bs.close()


def test_duplicate_tag_refused(client):
    rng = np.random.default_rng(4)
    a, b = handle(client, 20), handle(client, 21)
    with client.batch_stream(max_in_flight=2) as bs:
        f = bs.submit(0, [(a, 0, 1)], *batch(rng, 1), tag=150)  # held by the fake
        with pytest.raises(ac.InvalidArgument, match="tag 150 is still in flight"):
            bs.submit(0, [(b, 0, 1)], *batch(rng, 1), tag=150)
        g = bs.submit(0, [(b, 0, 1)], *batch(rng, 1), tag=7)  # releases the held one
        assert (f.result(10).tag, g.result(10).tag) == (150, 7)


def test_shared_region_equals_inline_and_closes(client, fake):
    rng = np.random.default_rng(5)
    a, b = handle(client, 30), handle(client, 31)
    q, k, v = batch(rng, 5)
    inline = client.extend_packed(0, [(a, 0, 2), (b, 0, 3)], q, k, v)
    region = client.shared_region(1 << 16)
    name = region.name
    assert region.alive and os.path.exists("/dev/shm/" + name[1:])
    r = client.extend_packed(0, [(a, 0, 2), (b, 0, 3)], q, k, v, region=region, timings={})
    np.testing.assert_array_equal(r.o, inline.o)
    assert [s.length for s in r.steps] == [2, 3]
    views = region.arrays(5, 4, 2, 8, "float32")  # in place: no copy into the region
    views["q"][:], views["k"][:], views["v"][:] = q, k, v
    r2 = client.extend_packed(0, [(a, 0, 2), (b, 0, 3)], views["q"], views["k"], views["v"],
                              region=region)
    np.testing.assert_array_equal(r2.o, inline.o)
    np.testing.assert_array_equal(views["o"], inline.o)
    with pytest.raises(ac.InvalidArgument, match="needs"):
        client.extend_packed(0, [(a, 0, 1000)], *batch(rng, 1000), region=region)
    del views
    region.close()
    assert not os.path.exists("/dev/shm/" + name[1:])
    for _ in range(100):
        if name in fake[0].ended:
            break
        threading.Event().wait(0.05)
    assert name in fake[0].ended
    with pytest.raises(ac.InvalidArgument, match="closed"):
        client.extend_packed(0, [(a, 0, 2), (b, 0, 3)], q, k, v, region=region)


def test_region_busy_in_a_stream(client):
    rng = np.random.default_rng(6)
    a, b = handle(client, 40), handle(client, 41)
    with client.shared_region(1 << 16) as region, client.batch_stream(max_in_flight=3) as bs:
        qa, ka, va = batch(rng, 2)
        f = bs.submit(0, [(a, 0, 2)], qa, ka, va, region=region, tag=100)  # held
        with pytest.raises(ac.InvalidArgument, match="in use by a batch in flight"):
            bs.submit(0, [(b, 0, 2)], *batch(rng, 2), region=region)
        qb, kb, vb = batch(rng, 2)
        g = bs.submit(0, [(b, 0, 2)], qb, kb, vb, tag=1)  # inline; releases the held one
        np.testing.assert_array_equal(f.result(10).o, 2 * qa)
        np.testing.assert_array_equal(g.result(10).o, 2 * qb)
        q, k, v = batch(rng, 2)  # the region is free again once its reply came
        r = bs.extend(0, [(b, 2, 2)], q, k, v, region=region, timeout=10)
        np.testing.assert_array_equal(r.o, 2 * q)


@pytest.mark.parametrize("max_call_bytes", [128 << 20, 1024])
def test_layer_calls_rows_tokens_and_chunks(client, max_call_bytes):
    """LayerCalls.extend_layer (the transformers integration's one call per layer): the tokens
    each packed call carries, their positions, and o put back at those tokens (zeros
    elsewhere); a big step split into several calls. Needs torch."""
    torch = pytest.importorskip("torch", reason="LayerCalls needs torch")
    from attention_client.layer_calls import LayerCalls
    calls = LayerCalls(client, max_call_bytes=max_call_bytes)
    calls.record = True
    B, T = 3, 6
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, h, 8, generator=g) for h in (4, 2, 2))
    hs = [handle(client, 50 + b) for b in range(B)]
    seen = []
    real = client.extend_packed

    def spy(layer, steps, *a, **kw):
        seen.append([(s.id, pos, n) for s, pos, n in steps])
        return real(layer, steps, *a, **kw)
    client.extend_packed = spy
    try:
        o, failures = calls.extend_layer(0, [hs[0], None, hs[2]], [10, 0, 0], q, k, v,
                                         select=[[1, 2, 3, 4, 5], None, [0, 5]])
        assert failures == {}
        want = torch.zeros_like(q)
        want[0, 1:] = 2 * q[0, 1:]
        want[2, [0, 5]] = 2 * q[2, [0, 5]]
        assert torch.equal(o, want)
        if max_call_bytes > 1 << 20:
            assert seen == [[(hs[0].id, 10, 5), (hs[2].id, 0, 2)]]
        else:  # 1 KiB a call, 256 B a token, 2 rows: 2 tokens per row per call
            assert seen == [[(hs[0].id, 10, 2), (hs[2].id, 0, 2)], [(hs[0].id, 12, 2)],
                            [(hs[0].id, 14, 1)]]
        seen.clear()
        o, failures = calls.extend_layer(1, hs, [0, 13, 0], q[:, :1], k[:, :1], v[:, :1])
        assert list(failures) == [1] and isinstance(failures[1], ac.FailedPrecondition)
        want = 2 * q[:, :1]
        want[1] = 0
        assert torch.equal(o, want) and len(seen) == 1
        assert calls.timings[-1].rows == 3 and calls.timings[-1].tokens == 3
    finally:
        del client.extend_packed


def test_async_batch_stream_out_of_order(fake):
    """AsyncBatchStream: the held tag-100 batch is answered after tag 2; request-level error on
    one batch only; the in-flight bound."""
    from attention_client.aio import AsyncAttentionClient
    rng = np.random.default_rng(8)
    qa, ka, va = batch(rng, 2)
    qb, kb, vb = batch(rng, 1)

    async def run():
        async with AsyncAttentionClient(fake[1], timeout=30) as c:
            a, b = handle(c, 60), handle(c, 61)
            async with c.batch_stream(max_in_flight=2) as bs:
                fa = await bs.submit(0, [(a, 0, 2)], qa, ka, va, tag=100)
                fb = await bs.submit(0, [(b, 0, 1)], qb, kb, vb, tag=2)
                with pytest.raises(ac.InvalidArgument, match="already in flight"):
                    await bs.submit(0, [(b, 1, 1)], qb, kb, vb)
                order = []
                for f in asyncio.as_completed([fa, fb]):
                    order.append((await f).tag)
                ra, rb = fa.result(), fb.result()
                bad = await bs.submit(99, [(a, 2, 1)], qb, kb, vb)
                with pytest.raises(ac.InvalidArgument, match="layer 99"):
                    await bad
                ok = await bs.extend(0, [(b, 1, 1)], qb, kb, vb)
            return order, ra, rb, ok
    order, ra, rb, ok = asyncio.run(run())
    assert order == [2, 100]
    np.testing.assert_array_equal(ra.o, 2 * qa)
    np.testing.assert_array_equal(rb.o, 2 * qb)
    assert ok.steps[0].length == 2

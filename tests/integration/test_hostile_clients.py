"""Hostile and careless clients (issue 16 items 1, 7, 8, 11) against the real server binary on
loopback, each bounded in time:

1. Work per call: a sequence call over the bound (Extend, ExtendBatch in both forms,
   ExtendStream) is refused the same way before anything is appended; the issue's repro (q = k = v of shape (1, 60000, 1, 1), float32, cpu) gets
   RESOURCE_EXHAUSTED naming --max-cpu-score-pairs; with the bound off, two such calls
   abandoned by their client (1 s deadline) stop computing, so a tiny call from another client
   is answered right after their deadline instead of after their ~40 s of work; a paged-cpu
   prefill abandoned at its deadline stops part-way and is rolled back.
7. Echoed client text is cut: a 20 KB backend name gets INVALID_ARGUMENT (not the
   RESOURCE_EXHAUSTED that an over-long status text turns into) with a short message.
8. At the drain timeout, calls that were queued but never started get UNAVAILABLE
   ("draining"), not a closed socket.
11. Invalid UTF-8 in a string field: with --log-format json every line the server writes is
   JSON (libprotobuf's complaint included), and 60 such requests do not write 60 lines.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_hostile_clients.py
"""
import json
import os
import signal
import sys
import threading
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_proc import ServerProc, pb, pb_grpc  # noqa: E402


def tensor(a):
    return pb.Tensor(dtype=pb.FLOAT32, shape=list(a.shape), data=a.astype(np.float32).tobytes())


def attend_request(q, k, v, backend="cpu"):
    return pb.AttendRequest(q=tensor(q), k=tensor(k), v=tensor(v), backend=backend)


def repro_request():
    x = np.random.default_rng(0).standard_normal((1, 60000, 1, 1))
    return attend_request(x, x, x)


def tiny_request():
    x = np.ones((1, 4, 1, 1))
    return attend_request(x, x, x)


def test_over_budget_cpu_call_is_refused_naming_the_flag():
    with ServerProc("--threads", "2") as server:
        stub = pb_grpc.AttentionServiceStub(server.channel)
        t0 = time.time()
        try:
            stub.Attend(repro_request(), timeout=30)
            raise AssertionError("the repro call was computed")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            assert "--max-cpu-score-pairs" in e.details(), e.details()
        assert time.time() - t0 < 5, "refused only after computing"
        stub.Attend(tiny_request(), timeout=10)


def test_over_budget_sequence_calls_are_refused_before_anything_is_applied():
    """A prefill too large for the paged-cpu KV cache (Extend, per-step and packed ExtendBatch,
    ExtendStream) gets RESOURCE_EXHAUSTED naming --max-cpu-score-pairs at once, appends
    nothing, and a step of normal size on the same sequence still runs."""
    from attention_client import AttentionClient
    from attention_client.errors import ResourceExhausted
    with ServerProc("--threads", "2", "--max-cpu-score-pairs", "100000") as server, \
            AttentionClient(server.target) as client:
        seq = client.create_sequence(1, 4, 2, 16, dtype="float32")
        rng = np.random.default_rng(1)
        T = 400  # 4 heads x 400 x 200.5 = 320,800 pairs > 10^5
        q = rng.standard_normal((T, 4, 16)).astype(np.float32)
        kv = rng.standard_normal((T, 2, 16)).astype(np.float32)
        calls = {
            "Extend": lambda: seq.extend(0, 0, q, kv, kv, timeout=30),
            "ExtendBatch": lambda: client.extend_batch([(seq, 0, 0, q, kv, kv)], timeout=30),
            "packed": lambda: client.extend_packed(0, [(seq, 0, T)], q, kv, kv, timeout=30),
            "ExtendStream": lambda: stream.extend(seq, 0, 0, q, kv, kv),
        }
        stream = client.extend_stream(timeout=60)
        for name, call in calls.items():
            t0 = time.time()
            try:
                r = call()
                raise AssertionError(f"{name}: the over-budget prefill was computed: {r}")
            except ResourceExhausted as e:
                assert "--max-cpu-score-pairs" in str(e), (name, str(e))
            except grpc.RpcError as e:  # a stream may surface the status directly
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, e)
            assert time.time() - t0 < 5, f"{name}: refused only after computing"
            assert seq.refresh().layer_lengths[0] == 0, f"{name} appended k/v"
        # The stream goes on after its refused step; 64 tokens (4 x 64 x 32.5 = 8,320 pairs)
        # pass, and the sequence grows by them.
        r = stream.extend(seq, 0, 0, q[:64], kv[:64], kv[:64])
        assert r.length == 64, r.length
        stream.close()
        assert seq.refresh().layer_lengths[0] == 64


def test_abandoned_cpu_calls_stop_and_do_not_delay_other_clients():
    with ServerProc("--threads", "2", "--cpu-threads", "1", "--max-cpu-score-pairs", "0") as server:
        big = repro_request()
        outcomes = []
        sent = time.time()

        def abandoned():
            with grpc.insecure_channel(server.target) as ch:
                try:
                    pb_grpc.AttentionServiceStub(ch).Attend(big, timeout=1.0)
                    outcomes.append("OK")
                except grpc.RpcError as e:
                    outcomes.append(e.code().name)

        threads = [threading.Thread(target=abandoned) for _ in range(2)]
        for th in threads:
            th.start()
        time.sleep(0.3)  # both are computing (each holds one of the 2 batch threads)
        with grpc.insecure_channel(server.target) as ch:
            stub = pb_grpc.AttentionServiceStub(ch)
            stub.Attend(tiny_request(), timeout=30)
            done = time.time()
        for th in threads:
            th.join(timeout=10)
        assert outcomes == ["DEADLINE_EXCEEDED"] * 2, outcomes
        late = done - (sent + 1.0)
        print(f"tiny call answered {late * 1000:.0f} ms after the big calls' deadline")
        # ~40 s without the stop; the bound leaves room for a loaded 2-core CI machine.
        assert late < 0.5, f"tiny call answered {late:.3f} s after the big calls' deadline"
        # The workers are free again: a second tiny call is immediate.
        t0 = time.time()
        pb_grpc.AttentionServiceStub(server.channel).Attend(tiny_request(), timeout=10)
        assert time.time() - t0 < 0.5


def test_abandoned_prefill_stops_part_way_and_is_not_applied():
    """With the work bound off, a paged-cpu prefill of ~20 s (20,000 tokens, float64 reference)
    whose client gives up after 1 s stops computing at its deadline and is rolled back: a step
    at position 0 on the same sequence runs right after (it would wait for the sequence's lock
    for the whole prefill before, and then find position 20,000)."""
    from attention_client import AttentionClient
    from attention_client.errors import DeadlineExceeded
    with ServerProc("--threads", "2", "--cpu-threads", "1", "--max-cpu-score-pairs", "0") as server, \
            AttentionClient(server.target) as client:
        seq = client.create_sequence(1, 4, 2, 16, dtype="float32")
        rng = np.random.default_rng(2)
        T = 20000
        q = rng.standard_normal((T, 4, 16)).astype(np.float32)
        kv = rng.standard_normal((T, 2, 16)).astype(np.float32)
        sent = time.time()
        try:
            seq.extend(0, 0, q, kv, kv, timeout=1.0)
            raise AssertionError("the 20,000-token prefill finished within its 1 s deadline")
        except DeadlineExceeded:
            pass
        r = seq.extend(0, 0, q[:64], kv[:64], kv[:64], timeout=30)
        late = time.time() - (sent + 1.0)
        print(f"the next step on the sequence answered {late * 1000:.0f} ms after the deadline")
        assert r.length == 64, r.length
        # ~20 s without the stop; the bound leaves room for a loaded 2-core CI machine.
        assert late < 1.5, f"the next step answered {late:.3f} s after the prefill's deadline"
        assert seq.refresh().layer_lengths[0] == 64


def test_long_backend_name_is_invalid_argument_with_a_short_message():
    with ServerProc() as server:
        req = tiny_request()
        req.backend = "b" * 20000
        try:
            pb_grpc.AttentionServiceStub(server.channel).Attend(req, timeout=10)
            raise AssertionError("accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details()[:200])
            assert len(e.details()) < 1024, len(e.details())
            assert "(20000 bytes)" in e.details(), e.details()


def test_queued_calls_get_unavailable_at_the_drain_timeout():
    server = ServerProc("--threads", "1", "--cpu-threads", "1", "--drain-timeout-s", "1",
                        "--max-cpu-score-pairs", "0")
    try:
        results = {}
        rng = np.random.default_rng(5)
        x = rng.standard_normal((1, 8192, 8, 64))
        long_req = attend_request(x, x, x)

        def call(name, req):
            with grpc.insecure_channel(server.target) as ch:
                try:
                    pb_grpc.AttentionServiceStub(ch).Attend(req, timeout=60)
                    results[name] = ("OK", "")
                except grpc.RpcError as e:
                    results[name] = (e.code().name, e.details())

        threads = [threading.Thread(target=call, args=("long", long_req))]
        threads[0].start()
        time.sleep(2.0)  # the long call computes on the only batch thread
        for i in range(3):
            y = np.ones((1, 2 + i, 2, 8))  # distinct shapes: queued behind it
            threads.append(threading.Thread(target=call, args=(f"queued{i}", attend_request(y, y, y))))
            threads[-1].start()
        time.sleep(1.0)
        assert not results, f"calls ended before SIGTERM: {results}"
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        for th in threads:
            th.join(timeout=30)
        assert code == 3, f"exit {code}: {server.log()[-2000:]}"
        for i in range(3):
            status, details = results[f"queued{i}"]
            assert status == "UNAVAILABLE" and "draining" in details, results
    finally:
        server.stop(sig=signal.SIGKILL)


def test_invalid_utf8_in_a_string_field_logs_json_only():
    server = ServerProc("--log-format", "json", "--log-level", "info")
    started = time.time()
    try:
        # AttendRequest with field 9 (backend, a string) holding bytes that are not UTF-8.
        raw = bytes([0x4A, 0x02, 0xFF, 0xFE])
        call = server.channel.unary_unary("/attention.v1.AttentionService/Attend",
                                          request_serializer=lambda b: b,
                                          response_deserializer=lambda b: b)
        for _ in range(60):  # a client repeating it cannot make the server log a line each time
            try:
                call(raw, timeout=10)
                raise AssertionError("a request with invalid UTF-8 was accepted")
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.OK
        assert server.stop() == 0
        with open(server.log_path, errors="replace") as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        assert lines, "no log"
        bad = []
        for ln in lines:
            try:
                json.loads(ln)
            except ValueError:
                bad.append(ln)
        assert not bad, f"non-JSON log lines: {bad[:3]}"
        utf8 = [ln for ln in lines if "invalid UTF-8" in json.loads(ln).get("message", "")]
        assert utf8, lines[-5:]
        # libprotobuf's lines are limited to 20 per 10 s (common/logging.h LineRateLimit); each
        # bad request may log up to 2 (its parse, and the service's own re-check).
        proto = [ln for ln in lines if json.loads(ln).get("message", "").startswith("protobuf (")]
        assert len(proto) <= 20 * (1 + int(time.time() - started) // 10), len(proto)
        # Cloud Logging's names (GKE): severity from the level, never from the stream.
        sev = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        assert all(json.loads(ln).get("severity") in sev for ln in lines), lines[-5:]
    finally:
        server.stop(sig=signal.SIGKILL)

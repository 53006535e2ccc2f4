"""Fault tests (issue 8) against the real attention-server binary on loopback:

1. A client that disconnects mid-stream on ExtendStream (its process SIGKILLed with a request in
   flight, or the call cancelled in-process): the server keeps serving, the sequence holds only
   whole steps (length = prefill + the steps applied, the unanswered one either wholly applied
   or not at all) and its cache holds exactly the k/v sent (a further step matches a float64
   oracle over that history), and releasing it returns every KV page.
2. SIGTERM under load (Attend and sequence decode loops): every call either completes with a
   correct result or gets UNAVAILABLE (nothing else, nothing half-written), and the process exits
   0 within the drain timeout. Open ExtendStreams (idle, waiting for their client's next
   message, or busy) end with UNAVAILABLE at once instead of holding the drain to its timeout.
3. An injected device fault (--inject-backend-fault-after=N): calls before N are correct, call N
   reaches the client as INTERNAL, grpc.health.v1 turns NOT_SERVING (overall and per service),
   and later calls are refused rather than answered.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_faults.py
"""
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from np_attention import attention, rel_error  # noqa: E402
from server_proc import SERVER, ServerProc  # noqa: E402
from stream_client import step_request, step_tensors  # noqa: E402
from attention_client import (AttentionClient, Internal, Unavailable)  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

N, K, H = 4, 2, 16
TOL = 1e-5  # fp32 (DESIGN.md §4)


def code_name(e):
    """"CANCELLED", "INTERNAL", ... for an AttentionError; the exception type otherwise."""
    code = getattr(e, "code", None)
    return code.name if code is not None else type(e).__name__


def wait_stable_length(client, seq_id, settle_s=0.3, timeout_s=10.0):
    """The layer-0 length once it stops changing (an orphaned step may still be running)."""
    deadline = time.time() + timeout_s
    last = client.sequence(seq_id).layer_lengths[0]
    while time.time() < deadline:
        time.sleep(settle_s)
        now = client.sequence(seq_id).layer_lengths[0]
        if now == last:
            return now
        last = now
    raise AssertionError("sequence length kept changing")


def check_history_and_release(server, client, seq, prefill, steps_applied, t, seed):
    """The cache holds prefill + `steps_applied` whole steps: a new step at the end matches the
    oracle over exactly that history; then release returns every page."""
    ks = [prefill[1]] + [step_tensors(seed, i, t, N, K, H)[1] for i in range(steps_applied)]
    vs = [prefill[2]] + [step_tensors(seed, i, t, N, K, H)[2] for i in range(steps_applied)]
    length = prefill[0].shape[0] + steps_applied * t
    rng = np.random.default_rng(seed + 7)
    q, k, v = (rng.standard_normal((1, n, H)).astype(np.float32) for n in (N, K, K))
    res = seq.extend(0, length, q, k, v)
    assert res.length == length + 1 and not res.replayed
    want = attention(q, np.concatenate(ks + [k]), np.concatenate(vs + [v]), "bottom_right")
    assert rel_error(res.o, want) <= TOL
    seq.release()
    assert server.kv_usage() == (0, 0), "KV pages or sequences left after release"


def attend_ok(client):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 5, n, H)).astype(np.float32) for n in (N, K, K))
    r = client.attend(q, k, v, causal="bottom_right")
    assert rel_error(r.o[0], attention(q[0], k[0], v[0], "bottom_right")) <= TOL


@pytest.mark.parametrize("t,acks", [(1, 0), (1, 3), (3, 2)])
def test_client_killed_mid_stream(t, acks):
    with ServerProc("--threads", "2", "--cpu-threads", "1") as server:
        client = AttentionClient(server.target, identity="fault-a")
        seed = 100 + 10 * t + acks
        rng = np.random.default_rng(seed)
        prefill = tuple(rng.standard_normal((6, n, H)).astype(np.float32) for n in (N, K, K))
        seq = client.create_sequence(1, N, K, H, reserve_tokens=8)
        seq.extend(0, 0, *prefill)
        child = subprocess.run(
            [sys.executable, os.path.join(HERE, "stream_client.py"), server.target, "fault-a",
             seq.id, "6", str(acks), str(t), str(N), str(K), str(H), str(seed)],
            capture_output=True, text=True, timeout=60)
        assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
        assert f"sent {acks}" in child.stdout and child.stdout.count("ack ") == acks
        length = wait_stable_length(client, seq.id)
        # Whole steps only: the acknowledged ones, plus the orphaned one wholly or not at all.
        assert length in (6 + acks * t, 6 + (acks + 1) * t), length
        assert server.alive() and server.health() == "SERVING"
        attend_ok(client)
        check_history_and_release(server, client, seq, prefill, (length - 6) // t, t, seed)
        assert server.stop() == 0


def test_stream_cancelled_in_process():
    """Many streams cancelled at random points while others keep running."""
    with ServerProc("--threads", "2", "--cpu-threads", "1") as server:
        client = AttentionClient(server.target, identity="fault-c")
        stub = spb_grpc.SequenceServiceStub(server.channel)
        for trial in range(6):
            t, seed = 1 + trial % 3, 300 + trial
            rng = np.random.default_rng(seed)
            prefill = tuple(rng.standard_normal((4, n, H)).astype(np.float32) for n in (N, K, K))
            seq = client.create_sequence(1, N, K, H)
            seq.extend(0, 0, *prefill)
            cancel_after = trial % 4
            sent = []
            got = threading.Event()

            def requests():
                pos = 4
                for i in range(cancel_after + 1):
                    sent.append(i)
                    yield step_request(seq.id, pos, seed, i, t, N, K, H)
                    pos += t
                    got.wait(5)
                    got.clear()
                time.sleep(5)  # keep the stream open until cancelled

            call = stub.ExtendStream(requests(), metadata=(("x-attn-identity", "fault-c"),),
                                     timeout=30)
            acked = 0
            try:
                for r in call:
                    assert r.code == 0, r.message
                    acked += 1
                    if acked == cancel_after:
                        # Cancel with the next request written and unanswered.
                        got.set()
                        time.sleep(0.002 * trial)
                        call.cancel()
                        break
                    got.set()
                if cancel_after == 0:
                    call.cancel()
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.CANCELLED, e
            length = wait_stable_length(client, seq.id)
            assert (length - 4) % t == 0, f"half-appended step: length {length}, T={t}"
            assert 4 + acked * t <= length <= 4 + len(sent) * t
            check_history_and_release(server, client, seq, prefill, (length - 4) // t, t, seed)
        attend_ok(client)
        assert server.health() == "SERVING"
        assert server.stop() == 0


def test_drain_timeout_bounds_shutdown_with_a_long_call_running():
    """--drain-timeout-s bounds the exit even while a computation that cannot be interrupted
    runs: a CPU Attend of many seconds is in flight at SIGTERM, the process exits with code 3
    shortly after the timeout, and that call's client gets an error, not a hang."""
    server = ServerProc("--threads", "2", "--cpu-threads", "1", "--drain-timeout-s", "1")
    result = {}
    try:
        rng = np.random.default_rng(3)
        t = 8192  # ~140 GFLOP on one CPU thread: many seconds, far longer than the drain
        q, k, v = (rng.standard_normal((1, t, 8, 64)).astype(np.float32) for _ in range(3))

        def long_call():
            try:
                with AttentionClient(server.target, timeout=300) as c:
                    c.attend(q, k, v, backend="cpu")
                result["outcome"] = "OK"
            except Exception as e:  # noqa: BLE001 (any error ends the call: that is the point)
                result["outcome"] = code_name(e)

        th = threading.Thread(target=long_call)
        th.start()
        time.sleep(3.0)  # sent (48 MB), decoded and computing
        assert "outcome" not in result, f"the long call ended before SIGTERM: {result}"
        t0 = time.time()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        elapsed = time.time() - t0
        th.join(timeout=30)
        assert code == 3, f"exit status {code} after {elapsed:.1f}s: {server.log()[-2000:]}"
        assert elapsed <= 1 + 4, f"exit took {elapsed:.1f}s with --drain-timeout-s 1"
        assert result.get("outcome") not in (None, "OK"), result
    finally:
        server.stop(sig=signal.SIGKILL)


def test_sigterm_ends_open_streams_and_exits_promptly():
    """ExtendStreams left open (clients that keep the stream for their next token) do not hold
    the drain: at SIGTERM the idle ones end at once and the busy ones right after their current
    step, each with UNAVAILABLE; the process exits 0 well inside --drain-timeout-s (30 s)."""
    server = ServerProc("--threads", "2", "--cpu-threads", "1")
    try:
        stub = spb_grpc.SequenceServiceStub(server.channel)
        client = AttentionClient(server.target, identity="drain")
        md = (("x-attn-identity", "drain"),)
        ends, lock, answered = {}, threading.Lock(), threading.Barrier(7)
        release = threading.Event()

        def stream(i, busy):
            seq = client.create_sequence(1, N, K, H)
            acks = 0

            def requests():
                pos = 0
                for step in range(10**6 if busy else 1):
                    yield step_request(seq.id, pos, 40 + i, step, 1, N, K, H)
                    pos += 1
                release.wait(60)  # idle: keep the stream open, send nothing more

            try:
                for r in stub.ExtendStream(requests(), metadata=md, timeout=60):
                    assert r.code == 0, r.message
                    acks += 1
                    if acks == 1:
                        answered.wait(30)
                outcome = ("OK", "")
            except grpc.RpcError as e:
                outcome = (e.code().name, e.details() or "")
            with lock:
                ends[i] = (busy, acks) + outcome

        threads = [threading.Thread(target=stream, args=(i, i >= 4)) for i in range(6)]
        for th in threads:
            th.start()
        answered.wait(30)  # every stream has had a step answered
        t0 = time.time()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        elapsed = time.time() - t0
        release.set()
        for th in threads:
            th.join(timeout=30)
        assert code == 0, f"exit status {code} after {elapsed:.1f}s: {server.log()[-2000:]}"
        assert elapsed < 10, f"exit took {elapsed:.1f}s with 6 open streams"
        assert len(ends) == 6, ends
        for i, (busy, acks, status, detail) in ends.items():
            assert acks >= 1, ends
            assert status == "UNAVAILABLE", ends
            assert "shutting down" in detail, ends
    finally:
        server.stop(sig=signal.SIGKILL)


def test_sigterm_under_load_completes_or_unavailable():
    drain_s = 20
    server = ServerProc("--threads", "2", "--cpu-threads", "1", "--drain-timeout-s",
                        str(drain_s))
    outcomes, bad, lock = {}, [], threading.Lock()
    stop_all = threading.Event()
    sigterm_at = [None]  # time.monotonic() of SIGTERM
    local = threading.local()

    def started():
        local.start = time.monotonic()

    def record(kind, code, detail=""):
        with lock:
            # In flight at SIGTERM: started (client side) at least 10 ms before the signal and
            # ended after it. A call sent after SIGTERM races with the listener's final shutdown
            # and may also be cancelled by gRPC (CANCELLED) rather than refused by the service.
            sig = sigterm_at[0]
            if sig is None or time.monotonic() < sig:
                when = "done before"
            elif local.start < sig - 0.010:
                when = "in flight at"
            else:
                when = "sent after"
            outcomes[(kind, code, when)] = outcomes.get((kind, code, when), 0) + 1
            allowed = ("OK", "UNAVAILABLE") + (("CANCELLED",) if when == "sent after" else ())
            if code not in allowed:
                bad.append(f"{kind} {when} SIGTERM: {code} {detail}")

    def attend_loop(wid):
        client = AttentionClient(server.target, timeout=30)
        rng = np.random.default_rng(wid)
        while not stop_all.is_set():
            # ~50-100 ms each on the cpu backend, so some are running when SIGTERM comes.
            q, k, v = (rng.standard_normal((1, 384, n, H)).astype(np.float32) for n in (N, K, K))
            try:
                started()
                r = client.attend(q, k, v, causal="top_left")
            except Unavailable:
                record("attend", "UNAVAILABLE")
                return
            except Exception as e:  # noqa: BLE001 - any other outcome is a failure
                record("attend", code_name(e), str(e))
                return
            err = rel_error(r.o[0], attention(q[0], k[0], v[0], "top_left"))
            record("attend", "OK" if err <= TOL else "WRONG", f"rel error {err}")

    def sequence_loop(wid):
        client = AttentionClient(server.target, timeout=30, identity=f"gen-{wid}")
        rng = np.random.default_rng(1000 + wid)
        while not stop_all.is_set():
            try:
                started()
                seq = client.create_sequence(1, N, K, H, reserve_tokens=40)
            except Unavailable:
                record("create", "UNAVAILABLE")
                return
            except Exception as e:  # noqa: BLE001
                record("create", code_name(e), str(e))
                return
            ks, vs = [], []
            try:
                for step in range(12):
                    t = 16 if step == 0 else 1
                    q, k, v = (rng.standard_normal((t, n, H)).astype(np.float32)
                               for n in (N, K, K))
                    pos = sum(x.shape[0] for x in ks)
                    try:
                        started()
                        r = seq.extend(0, pos, q, k, v)
                    except Unavailable:
                        record("extend", "UNAVAILABLE")
                        break
                    ks.append(k)
                    vs.append(v)
                    want = attention(q, np.concatenate(ks), np.concatenate(vs), "bottom_right")
                    ok = r.length == pos + t and rel_error(r.o, want) <= TOL
                    record("extend", "OK" if ok else "WRONG", f"length {r.length} at {pos}+{t}")
            except Exception as e:  # noqa: BLE001
                record("extend", code_name(e), str(e))
            try:
                started()
                seq.release()
                record("release", "OK")
            except Unavailable:
                record("release", "UNAVAILABLE")
            except Exception as e:  # noqa: BLE001
                record("release", code_name(e), str(e))

    threads = [threading.Thread(target=attend_loop, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=sequence_loop, args=(i,)) for i in range(3)]
    try:
        for th in threads:
            th.start()
        time.sleep(2.0)
        with lock:
            before = sum(n for key, n in outcomes.items() if key[1] == "OK")
        assert before > 0, f"no call completed before SIGTERM: {outcomes}"
        t0 = time.time()
        sigterm_at[0] = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=drain_s + 10)
        elapsed = time.time() - t0
        stop_all.set()
        for th in threads:
            th.join(timeout=60)
        assert code == 0, f"exit status {code} after {elapsed:.1f}s: {server.log()[-3000:]}"
        assert elapsed <= drain_s + 5, f"exit took {elapsed:.1f}s"
        assert not bad, f"calls neither completed correctly nor UNAVAILABLE: {bad[:5]}"
        assert any(o[1] == "UNAVAILABLE" for o in outcomes), outcomes
        assert any(o[1] == "OK" and o[2] == "in flight at" for o in outcomes), \
            f"no call was running at SIGTERM: {outcomes}"
        print("outcomes:", outcomes, f"exit in {elapsed:.2f}s")
    finally:
        stop_all.set()
        server.stop(sig=signal.SIGKILL)


def test_injected_device_fault_turns_health_not_serving():
    fault_at = 3
    with ServerProc("--threads", "2", "--default-backend", "cpu",
                    f"--inject-backend-fault-after={fault_at}") as server:
        client = AttentionClient(server.target)
        for service in ("", "attention.v1.AttentionService"):
            assert server.health(service) == "SERVING"
        for _ in range(fault_at - 1):
            attend_ok(client)
        rng = np.random.default_rng(2)
        q, k, v = (rng.standard_normal((1, 5, n, H)).astype(np.float32) for n in (N, K, K))
        with pytest.raises(Internal) as err:
            client.attend(q, k, v)
        assert "injected device fault" in str(err.value)
        for service in ("", "attention.v1.AttentionService", "attention.v1.SequenceService"):
            assert server.health(service) == "NOT_SERVING", service
        # A faulted server answers nothing as if it were healthy.
        with pytest.raises((Internal, Unavailable)):
            client.attend(q, k, v)
        assert server.health("") == "NOT_SERVING"
        assert "device fault" in server.log()
        assert server.alive()
    # The hook is hidden from --help.
    out = subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--listen" in out.stdout
    assert "inject-backend-fault" not in out.stdout

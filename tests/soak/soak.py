#!/usr/bin/env python3
"""Soak test (issue 8): mixed load against the real attention-server on loopback for a set time,
then checks that nothing broke and nothing leaked.

Load (--workers threads, each picking actions at random, seeded):
  attend        random valid shapes (padded/varlen, fp32/fp16/bf16, GQA, causal, window, lse);
                fp32 results checked against a float64 numpy oracle
  attend_bad    wrong byte sizes, unknown dtype, N % K != 0, unknown or unusable backend, bad
                varlen lengths → INVALID_ARGUMENT / FAILED_PRECONDITION
  attend_deadline  deadlines of 1-100 µs → DEADLINE_EXCEEDED (or a correct result)
  attend_cancel    cancelled after 0-3 ms → CANCELLED (or a correct result)
  attend_over_budget  over --max-cpu-score-pairs (10^6 here) → RESOURCE_EXHAUSTED naming the flag
  slow_reader   two Attend calls on raw HTTP/2 that never reads, then the client goes away (only
                with the h2 package; the report's counts show whether it ran)
  lifecycle     CreateSequence → prefill every layer → decode steps through Extend, ExtendBatch
                and ExtendStream → ForkSequence (+ a step on the child) → TruncateSequence (+ a
                step) → a step under a tiny deadline and a stream cancelled mid-way (the length
                is then re-read: it must be whole steps, and the history follows it) → Release;
                every fp32 result checked against the oracle over the history the client sent
  sequence_bad  unknown / malformed / foreign / released ids, wrong position, wrong shapes, bad
                CreateSequence fields → NOT_FOUND / INVALID_ARGUMENT / FAILED_PRECONDITION
RESOURCE_EXHAUSTED (queue or KV cache full) is allowed everywhere; any other unexpected status,
a wrong result or a half-written step fails the run.

After the load: the server process is alive, health SERVING, a good Attend is correct, the KV
cache has as many pages in use and live sequences as before the load (0), resident memory
(VmRSS) at the end <= resident memory after warm-up + --rss-slack-mib (64), and SIGTERM stops it
with exit status 0. Prints a report (and writes it as JSON with --report); exit 0 when all hold.

Usage: soak.py --duration SECONDS [--warmup S] [--workers N] [--seed N] [--report PATH]
       (ATTN_SERVER_BIN or --server: the binary)
"""
import argparse
import json
import os
import random
import sys
import threading
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import server_proc  # noqa: E402
from np_attention import attention, rel_error  # noqa: E402
from attention_client import (AttentionClient, AttentionError, Cancelled,  # noqa: E402
                              DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound,
                              ResourceExhausted)
from attention_client import tensors as T  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import attention_pb2_grpc as pb_grpc  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

try:  # slow readers need raw HTTP/2 (the h2 package, scripts/bootstrap.sh installs it)
    import h2  # noqa: F401
    from test_slow_readers import StalledConnection  # noqa: E402
except ImportError:
    StalledConnection = None

TOL = 1e-5  # fp32 (DESIGN.md §4)
SERVER_ARGS = ["--threads", "4", "--cpu-threads", "1", "--kv-cache-bytes", str(64 << 20),
               "--max-queue-requests", "256", "--log-level", "warn",
               # Work bound (issue 16): far above every problem attend_problem() makes (at most
               # ~2,300 pairs), below the one attend_over_budget sends.
               "--max-cpu-score-pairs", "1000000", "--response-write-timeout-s", "5"]


class Failure(Exception):
    pass


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []

    def add(self, action, outcome):
        with self.lock:
            key = f"{action}:{outcome}"
            self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, msg):
        with self.lock:
            self.failures.append(msg)


def code_of(e):
    return type(e).__name__


class Worker:
    def __init__(self, wid, target, seed, stats, deadline):
        self.wid = wid
        self.rng = np.random.default_rng(seed)
        self.py = random.Random(seed)
        self.stats = stats
        self.deadline = deadline
        self.identity = f"soak-{wid}"
        self.target = target
        self.client = AttentionClient(target, timeout=60, identity=self.identity)
        self.other = AttentionClient(target, timeout=60, identity=f"soak-other-{wid}")
        self.attn = pb_grpc.AttentionServiceStub(self.client._channel)
        self.seq = spb_grpc.SequenceServiceStub(self.client._channel)
        self.md = (("x-attn-identity", self.identity),)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def expect(self, action, fn, allowed):
        """Runs fn; an AttentionError must be one of `allowed` (or ResourceExhausted)."""
        try:
            result = fn()
        except AttentionError as e:
            if isinstance(e, allowed + (ResourceExhausted,)):
                self.stats.add(action, code_of(e))
                return None
            raise Failure(f"{action}: unexpected {code_of(e)}: {e}") from None
        self.stats.add(action, "OK")
        return result

    # -- stateless ---------------------------------------------------------------------------
    def attend_problem(self):
        n_kv = self.py.choice([1, 2])
        n = n_kv * self.py.choice([1, 2])
        h = self.py.choice([8, 16, 32])
        causal = self.py.choice([None, "top_left", "bottom_right"])
        if self.py.random() < 0.3:  # varlen
            b = self.py.randint(1, 3)
            ql = [self.py.randint(0, 8) for _ in range(b)]
            kl = [self.py.randint(0, 12) for _ in range(b)]
            ql[0] = max(ql[0], 1)
            kl[0] = max(kl[0], 1)
            q, k, v = self.randn(sum(ql), n, h), self.randn(sum(kl), n_kv, h), \
                self.randn(sum(kl), n_kv, h)
            return dict(q=q, k=k, v=v, causal=causal, q_lengths=ql, kv_lengths=kl, varlen=True)
        b, t, s = self.py.randint(1, 2), self.py.randint(1, 12), self.py.randint(1, 24)
        return dict(q=self.randn(b, t, n, h), k=self.randn(b, s, n_kv, h),
                    v=self.randn(b, s, n_kv, h), causal=causal)

    def check_attend(self, p, r):
        if p.get("varlen"):
            oq = ok = 0
            for tq, tk in zip(p["q_lengths"], p["kv_lengths"]):
                if tq and not tk and np.any(r.o[oq:oq + tq] != 0):
                    raise Failure("attend (varlen): rows that see no key are not zero")
                if tq and tk:
                    want = attention(p["q"][oq:oq + tq], p["k"][ok:ok + tk],
                                     p["v"][ok:ok + tk], p["causal"])
                    if rel_error(r.o[oq:oq + tq], want) > TOL:
                        raise Failure("attend (varlen): result differs from the oracle")
                oq, ok = oq + tq, ok + tk
            return
        for b in range(p["q"].shape[0]):
            want = attention(p["q"][b], p["k"][b], p["v"][b], p["causal"])
            if rel_error(r.o[b], want) > TOL:
                raise Failure("attend: result differs from the oracle")

    def attend(self):
        p = self.attend_problem()
        extra = {}
        if self.py.random() < 0.3:
            dtype = self.py.choice(["float16", "bfloat16"])
            extra = dict(dtype=dtype, return_lse=self.py.random() < 0.5)
            if p["causal"] is None and self.py.random() < 0.5:
                extra["window"] = (self.py.randint(0, 4), self.py.randint(0, 4))
            r = self.expect("attend", lambda: self.client.attend(**p, **extra), ())
            if r is not None and not np.all(np.isfinite(np.asarray(r.o, np.float32))):
                raise Failure("attend: non-finite output for finite input")
            return
        r = self.expect("attend", lambda: self.client.attend(**p), ())
        if r is not None:
            self.check_attend(p, r)

    def attend_bad(self):
        p = self.attend_problem()
        p.pop("varlen", None)
        req = self.client.build_request(**p, varlen=p["q"].ndim == 3)
        kind = self.py.randrange(6)
        if kind == 0:
            req.q.data = req.q.data[:-self.py.randint(1, 4)]
        elif kind == 1:
            req.k.dtype = self.py.choice([0, 9, 1234])
        elif kind == 2:
            req.backend = self.py.choice(["nope", "naive", "fused"])  # naive/fused: no GPU here
        elif kind == 3:
            req.q.shape[-1] += 1
        elif kind == 4:
            del req.kv_lengths[:]
            req.kv_lengths.extend([-1] * max(1, len(req.q_lengths)))
        else:
            req.mask.causal = 7
        try:
            self.attn.Attend(req, timeout=30)
        except grpc.RpcError as e:
            c = e.code()
            if c in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                     grpc.StatusCode.RESOURCE_EXHAUSTED):
                self.stats.add("attend_bad", c.name)
                return
            raise Failure(f"attend_bad kind {kind}: unexpected {c.name}: {e.details()}")
        if kind == 2 and req.backend in ("naive", "fused"):
            self.stats.add("attend_bad", "OK(gpu)")
            return
        raise Failure(f"attend_bad kind {kind}: a bad request succeeded")

    def attend_deadline(self):
        p = self.attend_problem()
        r = self.expect("attend_deadline",
                        lambda: self.client.attend(**p, timeout=self.py.uniform(1e-6, 1e-4)),
                        (DeadlineExceeded,))
        if r is not None:
            self.check_attend(p, r)

    def attend_cancel(self):
        p = self.attend_problem()
        p.pop("varlen", None)
        req = self.client.build_request(**p, varlen=p["q"].ndim == 3)
        fut = self.attn.Attend.future(req, timeout=30)
        time.sleep(self.py.uniform(0, 0.003))
        fut.cancel()
        try:
            fut.result()
            self.stats.add("attend_cancel", "OK")
        except grpc.FutureCancelledError:
            self.stats.add("attend_cancel", "CANCELLED")
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED):
                self.stats.add("attend_cancel", e.code().name)
            else:
                raise Failure(f"attend_cancel: unexpected {e.code().name}")

    def attend_over_budget(self):
        """A call over --max-cpu-score-pairs: RESOURCE_EXHAUSTED naming the flag, nothing else."""
        t = self.py.randint(1001, 1400)  # t·t pairs > 10^6
        x = self.randn(1, t, 1, 8)
        req = self.client.build_request(q=x, k=x, v=x, backend="cpu")
        try:
            self.attn.Attend(req, timeout=30)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and \
                    "--max-cpu-score-pairs" in e.details():
                self.stats.add("attend_over_budget", "RESOURCE_EXHAUSTED")
                return
            raise Failure(f"attend_over_budget: unexpected {e.code().name}: {e.details()[:200]}")
        raise Failure("attend_over_budget: a call over the work bound was computed")

    def slow_reader(self):
        """Two Attend calls (64 KiB responses) on a raw HTTP/2 connection whose window stays
        0, then the client goes away: the server must free them (leak checks at the end)."""
        q = self.randn(1, 64, 4, 64)
        kv = self.randn(1, 8, 4, 64)
        t = lambda a: pb.Tensor(dtype=pb.FLOAT32, shape=list(a.shape), data=a.tobytes())  # noqa
        msg = pb.AttendRequest(q=t(q), k=t(kv), v=t(kv), backend="cpu").SerializeToString()
        body = b"\x00" + len(msg).to_bytes(4, "big") + msg
        c = StalledConnection(int(self.target.rsplit(":", 1)[1]))
        try:
            c.send_calls(2, body, time.time() + 10)
            time.sleep(self.py.uniform(0, 0.3))
        finally:
            c.close()
        self.stats.add("slow_reader", "abandoned")

    # -- sequences ---------------------------------------------------------------------------
    def step_req(self, sid, layer, pos, q, k, v):
        t = lambda a: pb.Tensor(dtype=pb.FLOAT32, shape=list(a.shape), data=a.tobytes())  # noqa
        return spb.ExtendRequest(sequence_id=sid, layer=layer, position=pos, q=t(q), k=t(k),
                                 v=t(v))

    def lengths(self, sid):
        info = self.client._call(self.seq.GetSequence, "GetSequence",
                                 spb.GetSequenceRequest(sequence_id=sid), 30)
        return list(info.sequence.layer_lengths)

    def verify_step(self, hist, layer, q, o, scale):
        ks = np.concatenate([x[0] for x in hist[layer]])
        vs = np.concatenate([x[1] for x in hist[layer]])
        want = attention(q, ks, vs, "bottom_right", scale)
        if rel_error(o, want) > TOL:
            raise Failure("sequence step differs from the oracle over the sent history")

    def step(self, seq, hist, layer, t, api, dims):
        """One step at the end of `layer`; returns True when it was applied."""
        n, kh, h, scale = dims
        pos = sum(x[0].shape[0] for x in hist[layer])
        q, k, v = self.randn(t, n, h), self.randn(t, kh, h), self.randn(t, kh, h)
        req = self.step_req(seq.id, layer, pos, q, k, v)
        if api == "batch":
            resp = self.expect("extend_batch", lambda: self.client._call(
                self.seq.ExtendBatch, "ExtendBatch", spb.ExtendBatchRequest(steps=[req]), 60), ())
            if resp is None:
                return False
            res = resp.results[0]
            if res.code != 0:
                if res.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]:
                    return False
                raise Failure(f"extend_batch step failed: {res.code} {res.message}")
            r = res.response
        elif api == "stream":
            try:
                results = list(self.seq.ExtendStream(iter([req]), metadata=self.md, timeout=60))
            except grpc.RpcError as e:
                raise Failure(f"extend_stream: {e.code().name} {e.details()}") from None
            if results[0].code != 0:
                if results[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]:
                    self.stats.add("extend_stream", "ResourceExhausted")
                    return False
                raise Failure(f"extend_stream: {results[0].code} {results[0].message}")
            self.stats.add("extend_stream", "OK")
            r = results[0].response
        else:
            r = self.expect("extend", lambda: self.client._call(self.seq.Extend, "Extend", req,
                                                                60), ())
            if r is None:
                return False
        if r.length != pos + t:
            raise Failure(f"Extend returned length {r.length}, expected {pos + t}")
        hist[layer].append((k, v))
        o = np.frombuffer(r.o.data, np.float32).reshape(t, n, h)
        self.verify_step(hist, layer, q, o, scale)
        return True

    def stable_length(self, sid, layer):
        """The layer's length once three reads 100 ms apart agree (a step the client gave up on
        may still be queued or running on the server)."""
        seen = [self.lengths(sid)[layer]]
        for _ in range(100):
            time.sleep(0.1)
            seen.append(self.lengths(sid)[layer])
            if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
                return seen[-1]
        raise Failure("sequence length did not settle")

    def resync(self, seq, hist, layer, sent, action):
        """After calls that may or may not have run: the layer holds whole steps, a prefix of
        `sent` (list of (k, v)); the history follows it."""
        length = self.stable_length(seq.id, layer)
        base = sum(x[0].shape[0] for x in hist[layer])
        pos, applied = base, 0
        while pos < length and applied < len(sent):
            pos += sent[applied][0].shape[0]
            applied += 1
        if pos != length:
            raise Failure(f"{action}: half-written step: length {length}, steps end at "
                          f"{[base] + [base + sum(s[0].shape[0] for s in sent[:i + 1]) for i in range(len(sent))]}")
        hist[layer].extend(sent[:applied])
        self.stats.add(action, f"applied{applied}/{len(sent)}")

    def lifecycle(self):
        kh = self.py.choice([1, 2])
        n, h, layers = kh * self.py.choice([1, 2]), self.py.choice([8, 16, 32]), \
            self.py.randint(1, 2)
        scale = 1.0 / np.sqrt(h)
        seq = self.expect("create", lambda: self.client.create_sequence(
            layers, n, kh, h, reserve_tokens=self.py.choice([0, 8, 40])), ())
        if seq is None:
            return
        dims = (n, kh, h, scale)
        hist = [[] for _ in range(layers)]
        children = []
        try:
            for layer in range(layers):
                self.step(seq, hist, layer, self.py.randint(1, 40), "extend", dims)
            for _ in range(self.py.randint(1, 8)):
                self.step(seq, hist, self.py.randrange(layers), 1,
                          self.py.choice(["extend", "batch", "stream"]), dims)
            if self.py.random() < 0.5:  # fork a prefix of every layer, step on the child
                length = self.py.randint(0, min(sum(x[0].shape[0] for x in l) for l in hist))
                child = self.expect("fork", lambda: seq.fork(length), ())
                if child is not None:
                    children.append(child)
                    chist = [self.cut(l, length) for l in hist]
                    self.step(child, chist, 0, 1, "extend", dims)
            if self.py.random() < 0.5:  # truncate, then step at the new end
                length = self.py.randint(0, sum(x[0].shape[0] for x in hist[0]))
                if self.expect("truncate", lambda: seq.truncate(length), ()) is not None:
                    hist = [self.cut(l, length) for l in hist]
                    self.step(seq, hist, 0, self.py.randint(1, 3), "extend", dims)
            if self.py.random() < 0.5:  # a step under a tiny deadline
                layer = self.py.randrange(layers)
                pos = sum(x[0].shape[0] for x in hist[layer])
                q, k, v = self.randn(1, n, h), self.randn(1, kh, h), self.randn(1, kh, h)
                self.expect("extend_deadline", lambda: self.client._call(
                    self.seq.Extend, "Extend", self.step_req(seq.id, layer, pos, q, k, v),
                    self.py.uniform(1e-6, 2e-4)), (DeadlineExceeded,))
                self.resync(seq, hist, layer, [(k, v)], "extend_deadline")
            if self.py.random() < 0.5:  # a stream cancelled after some results
                self.cancelled_stream(seq, hist, dims)
            self.step(seq, hist, 0, 1, "extend", dims)  # still consistent and correct
        finally:
            for s in children + [seq]:
                try:
                    s.release()
                    self.stats.add("release", "OK")
                except NotFound:
                    raise Failure("release of a live sequence: NOT_FOUND") from None

    @staticmethod
    def cut(layer_hist, length):
        out, pos = [], 0
        for k, v in layer_hist:
            if pos >= length:
                break
            take = min(k.shape[0], length - pos)
            out.append((k[:take], v[:take]))
            pos += take
        return out

    def cancelled_stream(self, seq, hist, dims):
        n, kh, h, _ = dims
        pos = sum(x[0].shape[0] for x in hist[0])
        sent, reqs = [], []
        for _ in range(self.py.randint(1, 4)):
            t = self.py.randint(1, 3)
            q, k, v = self.randn(t, n, h), self.randn(t, kh, h), self.randn(t, kh, h)
            reqs.append(self.step_req(seq.id, 0, pos, q, k, v))
            sent.append((k, v))
            pos += t
        call = self.seq.ExtendStream(iter(reqs), metadata=self.md, timeout=60)
        stop_after = self.py.randint(0, len(reqs) - 1)
        got = 0
        try:
            if stop_after == 0:
                call.cancel()
            for r in call:
                if r.code != 0 and r.code != grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]:
                    raise Failure(f"stream step failed: {r.code} {r.message}")
                got += 1
                if got >= stop_after:
                    call.cancel()
                    break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise Failure(f"cancelled stream: {e.code().name}") from None
        self.resync(seq, hist, 0, sent, "stream_cancel")

    def sequence_bad(self):
        kind = self.py.randrange(7)
        q, k, v = self.randn(1, 2, 8), self.randn(1, 1, 8), self.randn(1, 1, 8)
        if kind == 0:  # unknown id
            self.expect("sequence_bad", lambda: self.client._call(
                self.seq.Extend, "Extend", self.step_req("%032x" % self.py.getrandbits(128), 0,
                                                         0, q, k, v), 30), (NotFound,))
        elif kind == 1:  # malformed id
            self.expect("sequence_bad", lambda: self.client._call(
                self.seq.ReleaseSequence, "ReleaseSequence",
                spb.ReleaseSequenceRequest(sequence_id="../../etc"), 30), (InvalidArgument,))
        elif kind == 2:  # bad CreateSequence fields
            self.expect("sequence_bad", lambda: self.client._call(
                self.seq.CreateSequence, "CreateSequence", spb.CreateSequenceRequest(
                    num_layers=self.py.choice([0, 1]), num_heads=3, num_kv_heads=2, head_dim=8,
                    dtype=pb.FLOAT32), 30), (InvalidArgument,))
        else:
            seq = self.expect("create", lambda: self.client.create_sequence(1, 2, 1, 8), ())
            if seq is None:
                return
            released = False
            try:
                if kind == 3:  # wrong position
                    self.expect("sequence_bad", lambda: self.client._call(
                        self.seq.Extend, "Extend", self.step_req(seq.id, 0, 5, q, k, v), 30),
                        (FailedPrecondition,))
                elif kind == 4:  # wrong shapes / layer
                    self.expect("sequence_bad", lambda: self.client._call(
                        self.seq.Extend, "Extend", self.step_req(
                            seq.id, self.py.choice([0, 3]), 0, self.randn(1, 4, 8), k, v), 30),
                        (InvalidArgument,))
                elif kind == 5:  # another identity
                    self.expect("sequence_bad", lambda: self.other.sequence(seq.id),
                                (NotFound,))
                else:  # released twice
                    seq.release()
                    released = True
                    self.expect("sequence_bad", lambda: seq.release(), (NotFound,))
                if not released and self.lengths(seq.id) != [0]:
                    raise Failure("a rejected call changed the sequence")
            finally:
                if not released:
                    seq.release()

    ACTIONS = [("attend", 30), ("attend_bad", 10), ("attend_deadline", 8), ("attend_cancel", 8),
               ("attend_over_budget", 3), ("lifecycle", 30), ("sequence_bad", 10)]

    def run(self):
        actions = self.ACTIONS + ([("slow_reader", 2)] if StalledConnection is not None else [])
        names = [a for a, _ in actions]
        weights = [w for _, w in actions]
        try:
            while time.time() < self.deadline:
                action = self.py.choices(names, weights)[0]
                try:
                    getattr(self, action)()
                except Failure as e:
                    self.stats.fail(f"worker {self.wid}: {e}")
                except AttentionError as e:
                    self.stats.fail(f"worker {self.wid} {action}: unexpected {code_of(e)}: {e}")
                if len(self.stats.failures) > 20:
                    return
        except Exception as e:  # noqa: BLE001 - a crashed worker is a failed run
            self.stats.fail(f"worker {self.wid} crashed: {type(e).__name__}: {e}")
        finally:
            self.client.close()
            self.other.close()


def good_attend(target):
    rng = np.random.default_rng(12345)
    q, k, v = (rng.standard_normal((1, 9, n, 16)).astype(np.float32) for n in (4, 2, 2))
    with AttentionClient(target) as c:
        r = c.attend(q, k, v, causal="bottom_right")
    return rel_error(r.o[0], attention(q[0], k[0], v[0], "bottom_right"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, required=True, help="seconds of load")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the RSS baseline (default min(60, duration/4))")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-slack-mib", type=float, default=64)
    ap.add_argument("--report", help="write the report as JSON here")
    ap.add_argument("--server", default=server_proc.SERVER)
    args = ap.parse_args()
    server_proc.SERVER = args.server
    warmup = args.warmup if args.warmup is not None else min(60.0, args.duration / 4)

    server = server_proc.ServerProc(*SERVER_ARGS)
    report = {"command": " ".join(sys.argv), "server_args": SERVER_ARGS,
              "duration_s": args.duration, "warmup_s": warmup, "workers": args.workers,
              "seed": args.seed}
    failures = []
    try:
        start_kv = server.kv_usage()
        report["rss_start_mib"] = server.rss_bytes() / 2**20
        stats = Stats()
        t0 = time.time()
        deadline = t0 + args.duration
        workers = [Worker(i, server.target, args.seed * 1000 + i, stats, deadline)
                   for i in range(args.workers)]
        threads = [threading.Thread(target=w.run) for w in workers]
        for th in threads:
            th.start()
        rss_samples = []
        rss_warm = None
        while any(th.is_alive() for th in threads):
            time.sleep(1.0)
            if not server.alive():
                break
            now = time.time() - t0
            rss = server.rss_bytes() / 2**20
            if rss_warm is None and now >= warmup:
                rss_warm = rss
            if not rss_samples or now - rss_samples[-1][0] >= 10:
                rss_samples.append((round(now, 1), round(rss, 1)))
                print(f"[soak] t={now:6.1f}s rss={rss:7.1f} MiB actions="
                      f"{sum(stats.counts.values())} failures={len(stats.failures)}", flush=True)
        for th in threads:
            th.join(timeout=120)
        report["elapsed_s"] = round(time.time() - t0, 1)
        report["counts"] = dict(sorted(stats.counts.items()))
        report["actions"] = sum(stats.counts.values())
        report["rss_samples_mib"] = rss_samples
        failures += stats.failures
        if not server.alive():
            failures.append(f"server died (exit {server.proc.returncode}): {server.log()[-2000:]}")
        else:
            health = server.health()
            report["health_after"] = health
            if health != "SERVING":
                failures.append(f"health after the load: {health}")
            err = good_attend(server.target)
            report["good_attend_rel_error"] = err
            if err > TOL:
                failures.append(f"a good Attend after the load is wrong: rel error {err}")
            end_kv = server.kv_usage()
            report["kv_pages_used_start_end"] = [start_kv[0], end_kv[0]]
            report["sequences_start_end"] = [start_kv[1], end_kv[1]]
            if end_kv != start_kv:
                failures.append(f"KV cache not back to its start: (pages used, sequences) "
                                f"{start_kv} -> {end_kv}")
            rss_end = server.rss_bytes() / 2**20
            rss_warm = rss_warm if rss_warm is not None else rss_end
            report["rss_after_warmup_mib"] = round(rss_warm, 1)
            report["rss_end_mib"] = round(rss_end, 1)
            if rss_end > rss_warm + args.rss_slack_mib:
                failures.append(f"resident memory grew: {rss_warm:.1f} MiB after warm-up, "
                                f"{rss_end:.1f} MiB at the end (> +{args.rss_slack_mib} MiB)")
        if stats.counts.get("attend:OK", 0) == 0 or stats.counts.get("release:OK", 0) == 0:
            failures.append("the load did not run (no successful Attend or release)")
    finally:
        code = server.stop()
        report["exit_status"] = code
        if code != 0:
            failures.append(f"server exit status {code} after SIGTERM")
    report["failures"] = failures
    report["passed"] = not failures
    print(json.dumps(report, indent=1))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    print("soak: PASSED" if not failures else f"soak: FAILED ({len(failures)} problems)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

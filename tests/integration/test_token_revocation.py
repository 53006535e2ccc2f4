"""A token revoked by SIGHUP (issue 16 item 10) against the real attention-server on loopback:
the identity that lost its last token has its open ExtendStream ended with UNAUTHENTICATED (an
idle one at once), its sequences released (pages back, attn_kv_sequences_revoked_total counts
them, a warning in the log), and new calls refused; another identity keeps its stream and its
sequence.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_token_revocation.py
"""
import os
import queue
import signal
import sys
import tempfile
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import metrics_testlib as mt  # noqa: E402
from test_hostile_sequences import step  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import attention_pb2_grpc as pb_grpc  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"


def auth(token):
    return (("authorization", "Bearer " + token),)


class OpenStream:
    """An ExtendStream whose messages are sent one at a time (put) and stay open until closed."""

    def __init__(self, stub, token):
        self.q = queue.Queue()

        def gen():
            while True:
                item = self.q.get()
                if item is None:
                    return
                yield item

        self.results = stub.ExtendStream(gen(), metadata=auth(token), timeout=60)

    def step(self, request):
        self.q.put(request)
        return next(self.results)

    def close(self):
        self.q.put(None)


def test_revoked_identity_loses_its_streams_and_sequences():
    with tempfile.TemporaryDirectory() as tmp:
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            f.write(f"alice {ALICE}\nbob {BOB}\n")
        s = mt.Server("--auth-token-file", tokens)
        try:
            channel = grpc.insecure_channel(s.target)
            stub = spb_grpc.SequenceServiceStub(channel)

            def create_for(token):
                return stub.CreateSequence(
                    spb.CreateSequenceRequest(num_layers=1, num_kv_heads=8, head_dim=64,
                                              num_heads=8, dtype=pb.FLOAT32,
                                              reserve_tokens=16),
                    metadata=auth(token), timeout=10).sequence.sequence_id

            a1, a2, b1 = create_for(ALICE), create_for(ALICE), create_for(BOB)
            alice_stream, bob_stream = OpenStream(stub, ALICE), OpenStream(stub, BOB)
            assert alice_stream.step(step(a1, 0, 2)).code == 0
            assert bob_stream.step(step(b1, 0, 2)).code == 0
            # Revoke alice: the token file without her line, then SIGHUP.
            with open(tokens, "w") as f:
                f.write(f"bob {BOB}\n")
            s.proc.send_signal(signal.SIGHUP)
            try:
                next(alice_stream.results)  # idle: ends without another message
                raise AssertionError("alice's stream was not ended")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
                assert "revoked" in e.details()
            # Bob's stream and sequence are untouched.
            r = bob_stream.step(step(b1, 2, 1))
            assert r.code == 0 and r.response.length == 3
            bob_stream.close()
            info = pb_grpc.AttentionServiceStub(channel).GetServerInfo(
                pb.GetServerInfoRequest(), metadata=auth(BOB), timeout=10)
            assert info.kv_cache.sequences == 1  # alice's two are released
            deadline = time.time() + 10
            while time.time() < deadline:
                samples, _ = mt.parse(s.scrape())
                if mt.value(samples, "attn_kv_sequences_revoked_total") == 2:
                    break
                time.sleep(0.1)
            assert mt.value(samples, "attn_kv_sequences_revoked_total") == 2
            assert mt.value(samples, "attn_kv_sequences") == 1
            try:
                stub.GetSequence(spb.GetSequenceRequest(sequence_id=a2), metadata=auth(ALICE),
                                 timeout=10)
                raise AssertionError("a revoked token was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            assert 'identity "alice" has no token left' in s.read_log()
            channel.close()
        finally:
            s.close()

"""Child process for the stream-disconnect fault test (test_faults.py): opens an ExtendStream
on an existing sequence, sends decode steps one at a time (deterministic data, see step_tensors)
and prints "ack <i> <length>" after each result; after --acks results it sends one more step and
kills itself with SIGKILL without reading (a client that dies mid-stream, request in flight).

Usage: python3 stream_client.py TARGET IDENTITY SEQUENCE_ID START_POSITION ACKS T N K H SEED
"""
import os
import queue
import signal
import sys
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402


def step_tensors(seed, i, t, n, k, h):
    """q (t,n,h), k (t,k,h), v (t,k,h) float32 of decode step i."""
    rng = np.random.default_rng(seed * 100003 + i)
    return (rng.standard_normal((t, n, h)).astype(np.float32),
            rng.standard_normal((t, k, h)).astype(np.float32),
            rng.standard_normal((t, k, h)).astype(np.float32))


def tensor(a):
    return pb.Tensor(dtype=pb.FLOAT32, shape=list(a.shape), data=a.tobytes())


def step_request(seq_id, position, seed, i, t, n, k, h):
    q, kk, vv = step_tensors(seed, i, t, n, k, h)
    return spb.ExtendRequest(sequence_id=seq_id, layer=0, position=position, q=tensor(q),
                             k=tensor(kk), v=tensor(vv))


def main():
    target, identity, seq_id = sys.argv[1:4]
    position, acks, t, n, k, h, seed = map(int, sys.argv[4:11])
    requests = queue.Queue()

    def gen():
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    channel = grpc.insecure_channel(target)
    stub = spb_grpc.SequenceServiceStub(channel)
    results = stub.ExtendStream(gen(), metadata=(("x-attn-identity", identity),), timeout=60)
    for i in range(acks):
        requests.put(step_request(seq_id, position, seed, i, t, n, k, h))
        r = next(results)
        if r.code != 0:
            print(f"error {i} {r.code} {r.message}", flush=True)
            sys.exit(1)
        position = r.response.length
        print(f"ack {i} {position}", flush=True)
    requests.put(step_request(seq_id, position, seed, acks, t, n, k, h))
    print(f"sent {acks}", flush=True)
    time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()

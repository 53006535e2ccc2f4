"""The x-attn-replica-tag response header (issue 19 item 4): every call's initial metadata names
the replica that answered with the same 8-hex-digit tag that prefixes the sequence ids it
mints (GetServerInfo.replica.replica_tag), so an L7 proxy can route a sequence's calls by tag.
Checked with the Python gRPC stubs on the real server over loopback: unary calls that succeed
and fail, CreateSequence (tag == id prefix), ExtendStream, the health service, and a fixed
--replica-tag.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_replica_tag_header.py
"""
import os
import sys

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_proc import ServerProc, pb, pb_grpc  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client._pb import sequence_pb2_grpc as spb_grpc  # noqa: E402

HEADER = "x-attn-replica-tag"


def tag_of(call):
    """The header's values in a call's initial metadata (a list: it must appear once)."""
    return [v for k, v in call.initial_metadata() if k == HEADER]


def tensor(a):
    return pb.Tensor(dtype=pb.FLOAT32, shape=list(a.shape), data=a.astype(np.float32).tobytes())


def check_every_kind_of_call(server):
    """Asserts the header on each kind of call; returns the tag."""
    attn = pb_grpc.AttentionServiceStub(server.channel)
    seq = spb_grpc.SequenceServiceStub(server.channel)
    info, call = attn.GetServerInfo.with_call(pb.GetServerInfoRequest(), timeout=10)
    tag = info.replica.replica_tag
    assert len(tag) == 8 and tag_of(call) == [tag]
    x = np.ones((1, 4, 1, 8))
    _, call = attn.Attend.with_call(pb.AttendRequest(q=tensor(x), k=tensor(x), v=tensor(x),
                                                     backend="cpu"), timeout=10)
    assert tag_of(call) == [tag]
    try:  # a failing call carries it too (a router sees which replica refused)
        attn.Attend.with_call(pb.AttendRequest(q=tensor(x), backend="cpu"), timeout=10)
        raise AssertionError("an Attend without k and v succeeded")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert tag_of(e) == [tag], e.initial_metadata()
    created, call = seq.CreateSequence.with_call(spb.CreateSequenceRequest(
        num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8, dtype=pb.FLOAT32), timeout=10)
    sid = created.sequence.sequence_id
    assert tag_of(call) == [tag] and sid.startswith(tag)
    step = np.ones((1, 1, 8))
    stream = seq.ExtendStream(iter([spb.ExtendRequest(
        sequence_id=sid, layer=0, position=0, q=tensor(step), k=tensor(step), v=tensor(step))]),
        timeout=10)
    assert tag_of(stream) == [tag]
    replies = list(stream)
    assert len(replies) == 1 and replies[0].code == 0, replies
    health = server.channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
    _, call = health.with_call(b"", timeout=10)
    assert tag_of(call) == [tag]
    seq.ReleaseSequence(spb.ReleaseSequenceRequest(sequence_id=sid), timeout=10)
    return tag


def test_every_response_names_the_random_replica_tag():
    with ServerProc("--threads", "2") as a, ServerProc("--threads", "2") as b:
        tag_a, tag_b = check_every_kind_of_call(a), check_every_kind_of_call(b)
    assert tag_a != tag_b  # drawn per process (2^-32 chance of a false failure)


def test_fixed_replica_tag_is_used_for_ids_and_header():
    with ServerProc("--threads", "2", "--replica-tag", "00c0ffee") as server:
        assert check_every_kind_of_call(server) == "00c0ffee"

#!/usr/bin/env python3
"""Writes the request fuzzer's seed corpus (tests/fuzz/corpus/): small valid and invalid
attention.v1 requests in the harness's input format (request_fuzz_target.cc):

  b"\\x00" + AttendRequest
  b"\\x01" + CreateSequenceRequest
  b"\\x02" + ops + len16le(create) + CreateSequenceRequest + ExtendRequest
  b"\\x03" + ops + len16le(create) + CreateSequenceRequest + ExtendBatchRequest

Deterministic (fixed seed); tiny shapes so the whole corpus stays well under 200 KB.
Usage: python3 tests/fuzz/make_seeds.py [OUT_DIR]   (default: tests/fuzz/corpus next to this)
"""
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402

RNG = np.random.default_rng(8)
NP = {pb.FLOAT32: np.float32, pb.FLOAT16: np.float16}


def tensor(shape, dtype=pb.FLOAT32, data_elems=None, scale=None):
    n = int(np.prod(shape)) if data_elems is None else data_elems
    if dtype == pb.BFLOAT16:
        bits = (RNG.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype("<u2")
        data = bits.tobytes()
    elif dtype == pb.FLOAT8_E4M3:
        data = RNG.integers(0, 0x7f, n, dtype=np.uint8).tobytes()
    elif dtype in NP:
        data = RNG.standard_normal(n).astype(NP[dtype]).tobytes()
    else:
        data = RNG.bytes(4 * n)
    t = pb.Tensor(dtype=dtype, shape=list(shape), data=data)
    if scale is not None:
        t.scale = scale
    return t


def attend(q_shape, kv_shape, dtype=pb.FLOAT32, **kw):
    r = pb.AttendRequest(q=tensor(q_shape, dtype), k=tensor(kv_shape, dtype),
                         v=tensor(kv_shape, dtype))
    for key, value in kw.items():
        if key == "mask":
            r.mask.CopyFrom(value)
        else:
            setattr(r, key, value) if not isinstance(value, list) else getattr(r, key).extend(value)
    return r


def script(kind, ops, create, msg):
    c = create.SerializeToString()
    return bytes([kind, ops]) + struct.pack("<H", len(c)) + c + msg.SerializeToString()


def create(layers=2, n=2, k=1, h=8, dtype=pb.FLOAT32, **kw):
    return spb.CreateSequenceRequest(num_layers=layers, num_heads=n, num_kv_heads=k, head_dim=h,
                                     dtype=dtype, **kw)


def extend(t, n=2, k=1, h=8, dtype=pb.FLOAT32, layer=0, position=0, sequence_id=""):
    return spb.ExtendRequest(sequence_id=sequence_id, layer=layer, position=position,
                             q=tensor((t, n, h), dtype), k=tensor((t, k, h), dtype),
                             v=tensor((t, k, h), dtype))


def append_only(t, k=1, h=8, dtype=pb.FLOAT32, position=0):
    """An append-only step: k/v only, q unset (nothing attended, no output)."""
    return spb.ExtendRequest(position=position, append_only=True, k=tensor((t, k, h), dtype),
                             v=tensor((t, k, h), dtype))


def seeds():
    out = {}
    # Attend, valid.
    out["attend_padded_f32"] = attend((1, 3, 2, 8), (1, 5, 1, 8))
    out["attend_padded_f16_causal_br"] = attend(
        (2, 4, 2, 8), (2, 4, 2, 8), pb.FLOAT16, mask=pb.Mask(causal=pb.CAUSAL_BOTTOM_RIGHT),
        return_lse=True)
    out["attend_padded_bf16_topleft_window"] = attend(
        (1, 4, 4, 4), (1, 6, 2, 4), pb.BFLOAT16,
        mask=pb.Mask(causal=pb.CAUSAL_TOP_LEFT, window_left=2))
    out["attend_padded_lengths"] = attend((2, 3, 1, 4), (2, 5, 1, 4), q_lengths=[3, 1],
                                          kv_lengths=[0, 5], return_lse=True)
    out["attend_window_both"] = attend((1, 5, 1, 4), (1, 5, 1, 4),
                                       mask=pb.Mask(window_left=1, window_right=1), scale=0.5)
    v = attend((5, 2, 8), (7, 1, 8), layout=pb.LAYOUT_VARLEN, q_lengths=[2, 3],
               kv_lengths=[3, 4], mask=pb.Mask(causal=pb.CAUSAL_BOTTOM_RIGHT), return_lse=True)
    out["attend_varlen"] = v
    out["attend_named_cpu"] = attend((1, 2, 1, 4), (1, 2, 1, 4), backend="cpu")
    # Attend, invalid.
    bad = attend((1, 3, 2, 8), (1, 5, 1, 8))
    bad.q.data = bad.q.data[:-4]
    out["attend_bad_bytes"] = bad
    bad = attend((1, 3, 2, 8), (1, 5, 1, 8))
    bad.k.dtype = 17
    out["attend_bad_dtype"] = bad
    out["attend_heads_not_divisible"] = attend((1, 2, 3, 4), (1, 2, 2, 4))
    out["attend_rank3_padded"] = attend((3, 2, 8), (5, 1, 8))
    out["attend_negative_length"] = attend((1, 2, 1, 4), (1, 2, 1, 4), kv_lengths=[-1])
    out["attend_unknown_backend"] = attend((1, 2, 1, 4), (1, 2, 1, 4), backend="tpu")
    out["attend_fp8_no_scale"] = attend((1, 2, 1, 4), (1, 2, 1, 4), pb.FLOAT8_E4M3)
    out["attend_varlen_sum_mismatch"] = attend((5, 2, 8), (7, 1, 8), layout=pb.LAYOUT_VARLEN,
                                               q_lengths=[2, 2], kv_lengths=[3, 4])
    files = {name: b"\x00" + m.SerializeToString() for name, m in out.items()}

    # CreateSequence.
    creates = {
        "create_f32": create(),
        "create_bf16_reserve": create(dtype=pb.BFLOAT16, reserve_tokens=9),
        "create_fp8_scales": create(layers=1, n=2, k=2, h=4, kv_cache_dtype=pb.FLOAT8_E4M3,
                                    k_scales=[0.1, 0.2], v_scales=[0.3, 0.4]),
        "create_bad_heads": create(n=3, k=2),
        "create_fp8_dtype": create(dtype=pb.FLOAT8_E4M3),
        "create_huge_reserve": create(reserve_tokens=1 << 24),
    }
    for name, m in creates.items():
        files[name] = b"\x01" + m.SerializeToString()

    # Extend scripts: ops bit0 replay, bit1 fork (+bit2 prefix), bit3 truncate to ops >> 4.
    files["extend_prefill_replay"] = script(2, 0x01, create(), extend(3))
    files["extend_fork_prefix"] = script(2, 0x06, create(), extend(5))
    files["extend_truncate"] = script(2, 0x28, create(dtype=pb.FLOAT16), extend(4, dtype=pb.FLOAT16))
    files["extend_fp8_kv"] = script(2, 0x0b, create(kv_cache_dtype=pb.FLOAT8_E4M3), extend(2))
    files["extend_bf16_layer1"] = script(2, 0x03, create(dtype=pb.BFLOAT16),
                                         extend(1, dtype=pb.BFLOAT16, layer=1))
    files["extend_small_pages_gqa"] = script(2, 0x0f, create(n=4, k=2, h=4, reserve_tokens=6),
                                             extend(6, n=4, k=2, h=4))
    files["extend_bad_position"] = script(2, 0x00, create(), extend(1, position=3))
    files["extend_bad_layer"] = script(2, 0x00, create(), extend(1, layer=2))
    files["extend_shape_mismatch"] = script(2, 0x00, create(), extend(1, n=4))
    files["extend_unknown_id"] = script(2, 0x00, create(), extend(1, sequence_id="0" * 32))
    files["extend_bad_id"] = script(2, 0x00, create(), extend(1, sequence_id="not-an-id"))
    # ExtendBatch scripts.
    batch = spb.ExtendBatchRequest(steps=[extend(1), extend(2), extend(1)])
    files["batch_three"] = script(3, 0x00, create(), batch)
    batch = spb.ExtendBatchRequest(steps=[extend(1, layer=0), extend(1, layer=1)])
    files["batch_mixed_layers"] = script(3, 0x00, create(), batch)
    batch = spb.ExtendBatchRequest(steps=[extend(1, sequence_id="a" * 32),
                                          extend(1, sequence_id="a" * 32)])
    files["batch_duplicate"] = script(3, 0x00, create(), batch)
    files["batch_empty"] = script(3, 0x00, create(), spb.ExtendBatchRequest())

    # Append-only Extend scripts (last, so the RNG draws of the seeds above stay the same).
    files["extend_append_only"] = script(2, 0x0f, create(), append_only(3))
    files["extend_append_only_bf16_gqa"] = script(2, 0x23, create(n=4, k=2, h=4,
                                                                  dtype=pb.BFLOAT16),
                                                  append_only(5, k=2, h=4, dtype=pb.BFLOAT16))
    with_q = append_only(1)
    with_q.q.CopyFrom(tensor((1, 2, 8)))
    files["extend_append_only_with_q"] = script(2, 0x00, create(), with_q)

    return files


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    os.makedirs(out_dir, exist_ok=True)
    total = 0
    for name, data in sorted(seeds().items()):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        total += len(data)
    print(f"wrote {len(seeds())} seeds, {total} bytes, to {out_dir}")


if __name__ == "__main__":
    main()

"""numpy/torch ↔ attention.v1.Tensor conversion.

Wire dtypes: FLOAT32, FLOAT16, BFLOAT16 (little-endian, row-major, dense). bfloat16 is encoded
from float32 with bit operations (round to nearest even, NaN kept NaN) and decoded exactly by
widening to float32; no extra package is needed. When ``ml_dtypes`` is importable, numpy arrays
of dtype ``ml_dtypes.bfloat16`` are accepted and BFLOAT16 outputs come back in that dtype;
without it they come back as float32 arrays (exact values of the bf16 results).
"""
import numpy as np

from ._pb import attention_pb2 as pb
from .errors import InvalidArgument

try:  # optional
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    BFLOAT16 = None

_NAMES = {
    "float32": pb.FLOAT32, "fp32": pb.FLOAT32, "f32": pb.FLOAT32,
    "float16": pb.FLOAT16, "fp16": pb.FLOAT16, "f16": pb.FLOAT16, "half": pb.FLOAT16,
    "bfloat16": pb.BFLOAT16, "bf16": pb.BFLOAT16,
}
WIRE_NAMES = {pb.FLOAT32: "float32", pb.FLOAT16: "float16", pb.BFLOAT16: "bfloat16"}


def wire_dtype(name):
    """'float32' | 'float16' | 'bfloat16' (aliases fp32/fp16/bf16, numpy dtypes, torch dtypes,
    or a pb.DType value) → pb.DType."""
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        if int(name) in WIRE_NAMES:
            return int(name)
        raise InvalidArgument(f"unsupported dtype {name!r}: use float32, float16 or bfloat16")
    if isinstance(name, str):
        key = name
    else:
        try:
            key = np.dtype(name).name
        except TypeError:
            key = str(name)
    key = key.lower().replace("torch.", "")
    if key in _NAMES:
        return _NAMES[key]
    raise InvalidArgument(f"unsupported dtype {name!r}: use float32, float16 or bfloat16")


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def to_numpy(x):
    """numpy array, torch tensor or array-like → (numpy array, natural wire dtype or None).

    torch bfloat16 tensors are widened to float32 (exact) and reported as BFLOAT16."""
    if _is_torch(x):
        import torch
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.to(torch.float32).cpu().numpy(), pb.BFLOAT16
        return t.cpu().numpy(), None
    return np.asarray(x), None


def natural_wire_dtype(arr):
    """The wire dtype a numpy array is sent as: float32→FLOAT32, float16→FLOAT16,
    ml_dtypes.bfloat16→BFLOAT16, float64→FLOAT32 (narrowed). Others: InvalidArgument."""
    dt = arr.dtype
    if dt == np.float32 or dt == np.float64:
        return pb.FLOAT32
    if dt == np.float16:
        return pb.FLOAT16
    if dt.name == "bfloat16":
        return pb.BFLOAT16
    raise InvalidArgument(f"unsupported array dtype {dt}: use float32, float16, bfloat16 "
                          "(ml_dtypes or torch) or float64 (sent as float32)")


def float32_to_bf16_bits(a):
    """float32 array → uint16 array of bfloat16 bits, round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype("<u2")
    nan = np.isnan(a)
    if nan.any():
        rounded = np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype("<u2"),
                           rounded)
    return rounded


def bf16_bits_to_float32(bits):
    """uint16 bfloat16 bits → float32 array (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << np.uint32(16)).view("<f4")


def round_to_bf16(a):
    """float array → float32 array holding the values rounded to bfloat16 (what the server
    sees when the array is sent as BFLOAT16)."""
    return bf16_bits_to_float32(float32_to_bf16_bits(np.asarray(a, dtype=np.float32)))


_FORMS = {False: ("padded", {"q": "(B,T,N,H)", "k": "(B,S,K,H)", "v": "(B,S,K,H)"}),
          True: ("varlen", {"q": "(total_q,N,H)", "k": "(total_kv,K,H)", "v": "(total_kv,K,H)"})}


def attend_layout(shapes, varlen=None):
    """The layout of Attend's q, k and v; raises when one has the wrong rank, naming it.

    shapes: {"q": q.shape, "k": k.shape, "v": v.shape}. varlen: True (packed: q (total_q,N,H),
    k and v (total_kv,K,H), rank 3), False (padded: q (B,T,N,H), k and v (B,S,K,H), rank 4) or
    None: the layout whose rank at least two of the three have (so a lone q of the wrong rank is
    the one named, not k), q's when no two agree. Returns varlen (bool). Raises InvalidArgument
    naming each argument whose rank does not fit, with its shape and the expected layout.
    """
    ranks = {n: len(shapes[n]) for n in ("q", "k", "v")}
    if varlen is None:
        votes = list(ranks.values())
        varlen = votes.count(3) >= 2 or (votes.count(4) < 2 and ranks["q"] == 3)
    varlen = bool(varlen)
    want = 3 if varlen else 4
    wrong = [n for n in ("q", "k", "v") if ranks[n] != want]
    if not wrong:
        return varlen
    name, forms = _FORMS[varlen]
    other_name, other = _FORMS[not varlen]
    errors = "; ".join(f"{n} must be rank {want} {forms[n]}, got shape {tuple(shapes[n])}"
                       for n in wrong)
    raise InvalidArgument(f"{errors} ({name} layout: q {forms['q']}, k and v {forms['k']}; "
                          f"{other_name} has q {other['q']}, k and v {other['k']}, all rank "
                          f"{7 - want})")


def encode(arr, dtype, name=None):
    """numpy array → pb.Tensor of wire dtype `dtype` (pb.DType). name: the argument ("q"),
    named in the error for an empty array."""
    if arr.size == 0:
        what = f"{name}: empty" if name else "empty"
        raise InvalidArgument(f"{what} tensor of shape {arr.shape}: every extent must be >= 1 "
                              "(use lengths 0 for empty entries)")
    if dtype == pb.FLOAT32:
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
    elif dtype == pb.FLOAT16:
        data = np.ascontiguousarray(arr, dtype="<f2").tobytes()
    elif dtype == pb.BFLOAT16:
        if arr.dtype.name == "bfloat16":
            data = np.ascontiguousarray(arr).view("<u2").tobytes()
        else:
            data = float32_to_bf16_bits(np.asarray(arr, dtype=np.float32)).tobytes()
    else:
        raise InvalidArgument(f"unsupported wire dtype {dtype}")
    return pb.Tensor(dtype=dtype, shape=[int(s) for s in arr.shape], data=data)


def decode(t, bf16_as_float32=None):
    """pb.Tensor → numpy array (float32, float16; BFLOAT16 → ml_dtypes.bfloat16 when
    available and bf16_as_float32 is not True, else float32)."""
    shape = tuple(int(s) for s in t.shape)
    if t.dtype == pb.FLOAT32:
        return np.frombuffer(t.data, dtype="<f4").reshape(shape).astype(np.float32, copy=True)
    if t.dtype == pb.FLOAT16:
        return np.frombuffer(t.data, dtype="<f2").reshape(shape).astype(np.float16, copy=True)
    if t.dtype == pb.BFLOAT16:
        bits = np.frombuffer(t.data, dtype="<u2").reshape(shape)
        if BFLOAT16 is not None and not bf16_as_float32:
            return bits.astype(np.uint16).view(BFLOAT16).copy()
        return bf16_bits_to_float32(bits).reshape(shape).copy()
    raise InvalidArgument(f"server returned unsupported dtype {t.dtype}")


def to_torch(arr, like):
    """numpy result → torch tensor with `like`'s dtype and device."""
    import torch
    if arr.dtype.name == "bfloat16":
        arr = arr.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(device=like.device, dtype=like.dtype)

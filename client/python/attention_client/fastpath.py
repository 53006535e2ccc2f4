"""Fast path of Extend / ExtendBatch / ExtendStream: tensor bytes sent as they are.

Inputs whose dtype already is the sequence's dtype are sent without any conversion (no float32
detour, no ml_dtypes round trip, no NaN scan):
  torch tensors (CUDA or CPU) of torch.float32 / float16 / bfloat16;
  numpy arrays of float32 / float16 / ml_dtypes.bfloat16, or uint16 holding raw bfloat16 bits
  (for BFLOAT16 sequences; the outputs then come back as uint16 bits too).
Every q/k/v of one call must be of one kind (all numpy, or all torch on one device) and of the
sequences' one dtype; :func:`plan` says why not otherwise.

Gather: torch CUDA tensors of all steps are concatenated on the device into one flat tensor,
copied with ONE device→host copy into a pinned host buffer (one per thread, grown on demand,
kept), and slices of its bytes become the protobuf ``bytes`` fields; torch CPU tensors and numpy
arrays are copied once each into their ``bytes``. Scatter: the ``o`` bytes of every step are
copied into one host buffer (pinned for CUDA) and, for CUDA, moved with ONE host→device copy
(synchronous: ``o`` is usable on the caller's device when the call returns); each step's ``o``
is a (T, N, H) view of that one tensor/array, in q's dtype.
"""
import math
import threading

import numpy as np

from ._pb import attention_pb2 as pb
from .errors import Internal, InvalidArgument

_ITEMSIZE = {pb.FLOAT32: 4, pb.FLOAT16: 2, pb.BFLOAT16: 2}


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _torch_wire(dtype):
    import torch
    return {torch.float32: pb.FLOAT32, torch.float16: pb.FLOAT16,
            torch.bfloat16: pb.BFLOAT16}.get(dtype)


def _numpy_wire(dtype):
    """numpy dtype → pb.DType sent as it is, or None (cached per dtype: dtype.name alone
    costs a few µs)."""
    w = _NUMPY_WIRES.get(dtype, _MISS)
    if w is _MISS:
        w = _NUMPY_WIRES[dtype] = _numpy_wire_of(dtype)
    return w


_NUMPY_WIRES, _MISS = {}, object()


def _numpy_wire_of(dtype):
    if dtype.byteorder == ">":
        return None
    if dtype == np.float32:
        return pb.FLOAT32
    if dtype == np.float16:
        return pb.FLOAT16
    if dtype.name == "bfloat16" or dtype == np.uint16:
        return pb.BFLOAT16
    return None


class Plan:
    """How one call's tensors travel: kind ("cuda", "torch_cpu" or "numpy"), wire (pb.DType),
    dtype (torch or numpy dtype of q, given to the outputs) and device (torch only)."""
    __slots__ = ("kind", "wire", "dtype", "device")

    def __init__(self, kind, wire, dtype, device):
        self.kind, self.wire, self.dtype, self.device = kind, wire, dtype, device


def plan(steps):
    """(Plan, None) when every step's q/k/v can go as they are, else (None, reason).

    steps: sequence of (sequence, layer, position, q, k, v)."""
    if not steps:
        return None, "no steps"
    return plan_tensors([s[0] for s in steps], [t for s in steps for t in s[3:6]])


def plan_tensors(seqs, tensors):
    """(Plan, None) when `tensors` (q/k/v of one call, the first one giving the kind and
    dtype) can go as they are to `seqs` (the call's Sequence handles), else (None, reason)."""
    if not seqs or not tensors:
        return None, "no steps"
    first = tensors[0]
    if isinstance(first, np.ndarray):
        wire, dev, kind = _numpy_wire(first.dtype), None, "numpy"
    elif _is_torch(first):
        wire, dev = _torch_wire(first.dtype), first.device
        kind = "cuda" if dev.type == "cuda" else ("torch_cpu" if dev.type == "cpu" else None)
        if kind is None:
            return None, f"torch device {dev} (fast path: cuda or cpu)"
    else:
        return None, f"q is a {type(first).__name__} (fast path: torch tensor or numpy array)"
    if wire is None:
        return None, f"dtype {first.dtype} (fast path: float32, float16, bfloat16)"
    for s in seqs:
        if s.info.dtype != wire:
            return None, (f"sequence {s.id} has dtype {pb.DType.Name(s.info.dtype)}, the "
                          f"tensors {first.dtype}")
    for t in tensors:
        if kind == "numpy":
            if not isinstance(t, np.ndarray) or t.dtype != first.dtype:
                return None, "q/k/v of one call must all be numpy arrays of one dtype"
        elif not _is_torch(t) or t.dtype != first.dtype or t.device != dev:
            return None, "q/k/v of one call must all be torch tensors of one dtype and device"
    return Plan(kind, wire, first.dtype, dev), None


class _Pinned(threading.local):
    """Per-thread pinned host buffers (uint8 torch tensors with their numpy views), grown to the
    next power of two when a call needs more, never shrunk."""

    def __init__(self):
        self.bufs = {}

    def get(self, name, nbytes):
        import torch
        have = self.bufs.get(name)
        if have is None or have[0].numel() < nbytes:
            size = 1 << max(16, (int(nbytes) - 1).bit_length())
            t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            have = (t, t.numpy())
            self.bufs[name] = have
        return have


_PINNED = _Pinned()


def _check_nonempty(t):
    shape = t.shape
    if 0 in shape or len(shape) == 0:
        shape = tuple(shape)
        raise InvalidArgument(f"empty tensor of shape {shape}: every extent must be >= 1 "
                              "(use lengths 0 for empty entries)")


def tensor_views(p, tensors):
    """The raw bytes of each tensor (row-major) as 1-D uint8 buffers (numpy arrays), gathered
    per Plan `p`, in order. numpy / torch CPU: views of the (contiguous) tensors themselves
    (a copy only for a non-contiguous one); CUDA: views of the per-thread pinned buffer after
    ONE device→host copy of all of them (valid until this thread's next gather).
    Raises InvalidArgument for a tensor with an extent 0."""
    for t in tensors:
        _check_nonempty(t)
    if p.kind == "numpy":
        return [np.ascontiguousarray(t).reshape(-1).view(np.uint8) for t in tensors]
    import torch
    if p.kind == "torch_cpu":
        return [t.detach().contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors]
    flats = [t.detach().reshape(-1) for t in tensors]
    flat = torch.cat(flats) if len(flats) > 1 else flats[0]
    item = _ITEMSIZE[p.wire]
    nbytes = flat.numel() * item
    host, host_np = _PINNED.get("in", nbytes)
    host[:nbytes].view(p.dtype).copy_(flat)  # the one device→host copy (synchronous)
    out, off = [], 0
    for f in flats:
        n = f.numel() * item
        out.append(host_np[off:off + n])
        off += n
    return out


def tensor_bytes(p, tensors):
    """As tensor_views, but each tensor's bytes copied into a bytes object (the protobuf
    path: they become pb.Tensor.data)."""
    return [v.tobytes() for v in tensor_views(p, tensors)]


def fill_tensor(msg, wire, shape, data):
    """Sets a pb.Tensor message in place (no intermediate message copy)."""
    msg.dtype = wire
    msg.shape.extend(int(d) for d in shape)
    msg.data = data


def scatter_one(p, shape, dtype, data):
    """scatter(p, [(shape, dtype, data)])[0] (same checks and errors), numpy without the
    general loop: one writable copy of the bytes (a bytearray) viewed as p.dtype of `shape`."""
    if p.kind != "numpy":
        return scatter(p, [(shape, dtype, data)])[0]
    n = math.prod(int(d) for d in shape) * _ITEMSIZE[p.wire]
    if dtype != p.wire or len(data) != n:
        raise Internal(f"server returned o of dtype {dtype} and {len(data)} bytes; "
                       f"expected {pb.DType.Name(p.wire)} {tuple(shape)}")
    return np.frombuffer(bytearray(data), dtype=p.dtype).reshape(tuple(shape))


def scatter(p, outs):
    """outputs → list of o. outs: list of (shape, wire dtype, data) or None (failed step: None
    kept); data: the o bytes (bytes or a memoryview of the reply). One host buffer for all of
    them (the one copy of the bytes); CUDA: one host→device copy into a tensor of p.dtype on
    p.device. Raises Internal when the server answered in another dtype or size."""
    item = _ITEMSIZE[p.wire]
    total = 0
    for o in outs:
        if o is None:
            continue
        shape, dtype, data = o
        n = math.prod(int(d) for d in shape) * item
        if dtype != p.wire or len(data) != n:
            raise Internal(f"server returned o of dtype {dtype} and {len(data)} bytes; "
                           f"expected {pb.DType.Name(p.wire)} {tuple(shape)}")
        total += n
    if p.kind == "cuda":
        host, host_np = _PINNED.get("out", max(total, 1))
    else:
        host_np = np.empty(max(total, 1), dtype=np.uint8)
    off, spans = 0, []
    for o in outs:
        if o is None:
            spans.append(None)
            continue
        data = o[2]
        host_np[off:off + len(data)] = np.frombuffer(data, dtype=np.uint8)
        spans.append((off // item, (off + len(data)) // item, o[0]))
        off += len(data)
    if p.kind == "numpy":
        flat = host_np[:total].view(p.dtype)
    else:
        import torch
        if p.kind == "cuda":
            flat = torch.empty(total // item, dtype=p.dtype, device=p.device)
            flat.copy_(host[:total].view(p.dtype))  # the one host→device copy (synchronous)
        else:
            flat = torch.from_numpy(host_np[:total]).view(p.dtype)
    return [None if s is None else flat[s[0]:s[1]].reshape(tuple(s[2])) for s in spans]

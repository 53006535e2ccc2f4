"""SharedRegion: a host POSIX shared-memory region leased to the server (SharedMemoryLease), for
packed batches whose tensor bytes do not travel in the message.

    with client.shared_region(64 << 20) as region:
        r = client.extend_packed(layer, steps, q, k, v, region=region)   # same result as inline
        qv, kv, vv, ov = region.arrays(total, N, K, H, "float32")        # or write in place

The client creates the object (multiprocessing.shared_memory: shm_open + ftruncate, name
"/psm_..."), opens a SharedMemoryLease stream whose first message names it, and keeps the
stream open on a background thread: the server maps the region once the stream starts and
unmaps it when the stream ends. close() half-closes the stream (the lease ends OK), waits for
it to end, unmaps the client's mapping and unlinks the name. Same machine only (the server
opens the name in its own /dev/shm).

Layout used by extend_packed (offsets in bytes, each aligned to 64): q at 0, then k, v, o
((total_tokens, N, H), (total_tokens, K, H) twice, (total_tokens, N, H)); append-only: k at 0,
then v. Inputs that already are the views arrays() returns for that layout are not copied;
others are copied into the region (torch CUDA: one device→host copy per tensor), and o is
copied out of the region into a new array/tensor (CUDA: one host→device copy). One batch at a
time per region: a region named by a batch still in flight is refused (InvalidArgument).
"""
import numpy as np

from ._pb import sequence_pb2 as spb
from .errors import InvalidArgument
from .lease import Lease
from . import fastpath as _fp

_ALIGN = 64
_NAMES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "bfloat16": np.dtype("<u2")}


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def layout(shapes, itemsize):
    """shapes: q, k, v shapes (q None for append-only) → {name: (offset, nbytes)} for the
    names present (q, k, v, and o of q's shape when q is there), and the bytes needed."""
    out, off = {}, 0
    named = list(zip("qkv", shapes)) + ([("o", shapes[0])] if shapes[0] is not None else [])
    for name, shape in named:
        if shape is None:
            continue
        n = int(np.prod(shape)) * itemsize
        out[name] = (off, n)
        off = _align(off + n)
    return out, off


class SharedRegion:
    """A leased shared-memory region (see the module docstring).

    SharedRegion(client, nbytes, *, timeout=30.0): client an AttentionClient (blocking; the
    region can be named by an AsyncAttentionClient of the same identity too); nbytes >= 1;
    timeout: seconds to wait for the server's lease. Raises InvalidArgument (bad size, name),
    NotFound (the server cannot open the name: another machine, another /dev/shm),
    ResourceExhausted (--max-shared-memory-regions/-bytes), Unimplemented (a server without
    SharedMemoryLease), DeadlineExceeded (no answer within timeout).
    Attributes: name ("/psm_..."), nbytes, region_id (the server's id, named in RegionSlice),
    buf (a writable uint8 numpy view of the whole region). Context manager: close() on exit.
    """

    def __init__(self, client, nbytes, *, timeout=30.0):
        from multiprocessing import shared_memory
        if int(nbytes) < 1:
            raise InvalidArgument(f"nbytes must be >= 1, got {nbytes}")
        self.nbytes = int(nbytes)
        self._shm = shared_memory.SharedMemory(create=True, size=self.nbytes)
        self.name = "/" + self._shm.name.lstrip("/")
        self.buf = np.frombuffer(self._shm.buf, dtype=np.uint8, count=self.nbytes)
        self.region_id = None
        self._busy = False
        self._closed = False
        self._lease = None
        try:
            self._lease = Lease(client, spb.SharedMemoryLeaseRequest(name=self.name,
                                                                     bytes=self.nbytes),
                                timeout=timeout)
            self.region_id = self._lease.response.region_id
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"SharedRegion({self.name}, {self.nbytes} bytes, id={self.region_id})"

    @property
    def alive(self):
        """True while the lease stream is open (the server holds the region)."""
        return not self._closed and self._lease is not None and self._lease.alive

    def arrays(self, total_tokens, num_heads, num_kv_heads, head_dim, dtype, *,
               append_only=False):
        """The numpy views of q, k, v and o at the layout extend_packed uses for a batch of
        total_tokens rows → dict "q", "k", "v", "o" (append_only: "k", "v") of arrays
        (total_tokens, heads, head_dim). dtype: "float32", "float16", "bfloat16" (uint16 bits)
        or a numpy dtype (e.g. ml_dtypes.bfloat16). Write inputs there to skip the copy; o
        holds the last batch's output until the next call. Raises InvalidArgument when the
        region is too small."""
        dt = _NAMES[dtype.lower()] if isinstance(dtype, str) and dtype.lower() in _NAMES \
            else np.dtype(dtype)
        q = (total_tokens, num_heads, head_dim)
        kv = (total_tokens, num_kv_heads, head_dim)
        spans = self._layout([None if append_only else q, kv, kv], dt.itemsize)
        return {name: self.buf[off:off + n].view(dt).reshape(q if name in "qo" else kv)
                for name, (off, n) in spans.items()}

    def _layout(self, shapes, itemsize):
        spans, need = layout(shapes, itemsize)
        if need > self.nbytes:
            raise InvalidArgument(f"shared region {self.name} holds {self.nbytes} bytes; this "
                                  f"batch needs {need} (q, k, v, o at 64-byte alignment)")
        return spans

    def _stage(self, p, shapes, tensors, append_only):
        """Copies the batch's tensors (fastpath Plan p; q, k, v or k, v) into the region →
        (layout, {name: (region_id, offset, bytes)}); marks the region busy."""
        if self._closed or self.region_id is None:
            raise InvalidArgument(f"shared region {self.name} is closed")
        if self._busy:
            raise InvalidArgument(f"shared region {self.name} is in use by a batch in flight "
                                  "(one batch per region at a time)")
        spans = self._layout(shapes, _fp._ITEMSIZE[p.wire])
        names = ("k", "v") if append_only else ("q", "k", "v")
        for name, t in zip(names, tensors):
            off, n = spans[name]
            self._write(p, self.buf[off:off + n], t)
        self._busy = True
        return spans, {name: (self.region_id, off, n) for name, (off, n) in spans.items()}

    @staticmethod
    def _write(p, dst, t):
        if p.kind == "numpy":
            if t.__array_interface__["data"][0] == dst.__array_interface__["data"][0] \
                    and t.nbytes == dst.nbytes:
                return  # already in place (an arrays() view)
            dst[:] = np.ascontiguousarray(t).reshape(-1).view(np.uint8)
            return
        import torch
        torch.from_numpy(dst).view(t.dtype).copy_(t.detach().reshape(-1))

    def _read_o(self, p, spans, shape):
        """o (shape, Plan p's dtype) copied out of the region: numpy array, or torch tensor
        on p's device (CUDA: one host→device copy)."""
        off, n = spans["o"]
        src = self.buf[off:off + n]
        if p.kind == "numpy":
            return src.view(p.dtype).reshape(shape).copy()
        import torch
        host = torch.from_numpy(src).view(p.dtype).reshape(shape)
        return host.clone() if p.kind == "torch_cpu" else host.to(p.device)

    def close(self, timeout=10.0):
        """Ends the lease (half-close; the server unmaps), unmaps and unlinks the name.
        Idempotent. Views of buf/arrays() taken by the caller stay valid memory until they are
        dropped (the name is gone already)."""
        if self._closed:
            return
        self._closed = True
        if self._lease is not None:
            self._lease.close(timeout)
        self.buf = None
        try:
            self._shm.close()
        except BufferError:  # views still exported: the mapping goes with them
            pass
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass

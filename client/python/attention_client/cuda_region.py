"""CudaRegion: a region of the frontend's GPU memory leased to an attention-server on the same
GPU through CUDA IPC (SharedMemoryLease with cuda_ipc), for packed batches whose tensors never
leave the device.

    with client.cuda_region(64 << 20) as region:          # torch.uint8 buffer on cuda
        r = client.extend_packed(layer, steps, q, k, v, region=region)   # q/k/v torch CUDA
        r.o                                                # (total, N, H) on the same device

Per call: q/k/v are copied into the region on the current CUDA stream (device to device; inputs
that already are the views arrays() returns are not copied), the region's event is recorded on
that stream, the call sends slices only; after the reply the current stream waits on the
server's event and o is cloned out of the region on that stream (so o is ready in stream order,
like any torch result; the host is not blocked). Layout (offsets in bytes, 64-aligned): as
SharedRegion (shared_memory.layout): q, k, v, o. One batch at a time per region.

What it needs (README "CUDA IPC regions"): torch with CUDA (imported lazily, only here) and the
NVIDIA driver's libcuda.so.1 (cuIpcGetMemHandle, cuMemGetAddressRange, cuDeviceGetUuid through
ctypes: torch exposes no public IPC memory handle); both processes on one GPU of one node,
allowed to share device memory (same user or hostIPC; see the README). The allocation must
come from cudaMalloc: PyTorch's caching allocator does that unless
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, whose memory cuIpcGetMemHandle refuses.
"""
import ctypes

from ._pb import sequence_pb2 as spb
from .errors import FailedPrecondition, InvalidArgument
from . import fastpath as _fp
from .lease import Lease
from .shared_memory import layout


def _torch():
    try:
        import torch
    except ImportError as e:
        raise FailedPrecondition("CudaRegion needs PyTorch with CUDA (import torch failed: "
                                 f"{e}); use SharedRegion or inline tensors instead") from None
    if not torch.cuda.is_available():
        raise FailedPrecondition("CudaRegion needs a CUDA device, and torch sees none; use "
                                 "SharedRegion or inline tensors instead")
    return torch


class _Driver:
    """The few libcuda calls torch does not expose, on the primary context of one device."""
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise FailedPrecondition(f"CudaRegion: the NVIDIA driver library libcuda.so.1 "
                                         f"cannot be loaded ({e})") from None
            cls._check(lib, lib.cuInit(0), "cuInit")
            cls._lib = lib
        return cls._lib

    @staticmethod
    def _check(lib, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            lib.cuGetErrorName(rc, ctypes.byref(name))
            raise InvalidArgument(f"CudaRegion: {what} failed: CUresult {rc} "
                                  f"({(name.value or b'?').decode()})")

    @classmethod
    def export(cls, ptr, ordinal):
        """(memory handle bytes (64), allocation base, allocation size, "GPU-..." UUID) of the
        cudaMalloc allocation holding device address ptr on device `ordinal` (this process's
        numbering, as torch's)."""
        lib = cls.lib()
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        cls._check(lib, lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        cls._check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                   "cuDevicePrimaryCtxRetain")
        try:
            cls._check(lib, lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
            try:
                handle = (ctypes.c_ubyte * 64)()
                rc = lib.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(ptr))
                if rc != 0:
                    cls._check(lib, rc, "cuIpcGetMemHandle (is the memory from cudaMalloc? "
                                        "PyTorch's expandable_segments allocations are not)")
                base, size = ctypes.c_uint64(), ctypes.c_size_t()
                cls._check(lib, lib.cuMemGetAddressRange_v2(ctypes.byref(base),
                                                             ctypes.byref(size),
                                                             ctypes.c_uint64(ptr)),
                           "cuMemGetAddressRange")
                uuid = (ctypes.c_ubyte * 16)()
                get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
                cls._check(lib, get_uuid(ctypes.byref(uuid), dev), "cuDeviceGetUuid")
            finally:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            lib.cuDevicePrimaryCtxRelease_v2(dev)
        return bytes(handle), base.value, size.value, format_uuid(bytes(uuid))


def device_uuid(ordinal):
    """The "GPU-..." UUID of CUDA device `ordinal` (this process's numbering, as torch's) from
    the driver, without a context or an allocation: what GetServerInfoResponse.device_uuid
    must equal for a CudaRegion on that device. Raises FailedPrecondition (no libcuda.so.1) or
    InvalidArgument (a CUresult error, e.g. CUDA_ERROR_INVALID_DEVICE)."""
    lib = _Driver.lib()
    dev = ctypes.c_int()
    _Driver._check(lib, lib.cuDeviceGet(ctypes.byref(dev), int(ordinal)), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    _Driver._check(lib, get_uuid(ctypes.byref(raw), dev), "cuDeviceGetUuid")
    return format_uuid(bytes(raw))


def format_uuid(raw):
    """16 UUID bytes → "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as nvidia-smi -L prints it,
    and the server's GetServerInfoResponse.device_uuid)."""
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class CudaRegion:
    """A leased CUDA IPC region (see the module docstring).

    CudaRegion(client, nbytes=None, *, tensor=None, device=None, timeout=30.0): client an
    AttentionClient (blocking); either nbytes >= 1 (a new torch.uint8 buffer on `device`,
    default the current CUDA device) or tensor (a contiguous CUDA tensor whose bytes become the
    region; kept referenced until close()). timeout: seconds to wait for the lease.
    Raises FailedPrecondition (no torch/CUDA/libcuda here; the server has no GPU KV cache, or
    computes on another GPU: GetServerInfo.device_uuid), InvalidArgument (bad size, a tensor
    that is not contiguous CUDA memory, a handle the server cannot open: e.g. the two
    processes cannot share device memory), ResourceExhausted (--max-shared-memory-*),
    DeadlineExceeded.
    Attributes: nbytes, device (torch.device), region_id, buf (torch.uint8 view of the region),
    uuid (the GPU's), event (the client's torch.cuda.Event, interprocess), server_event.
    Context manager: close() on exit.
    """

    def __init__(self, client, nbytes=None, *, tensor=None, device=None, timeout=30.0):
        torch = _torch()
        if tensor is None:
            if nbytes is None or int(nbytes) < 1:
                raise InvalidArgument(f"nbytes must be >= 1, got {nbytes}")
            dev = torch.device("cuda", torch.cuda.current_device()) if device is None \
                else torch.device(device)
            tensor = torch.empty(int(nbytes), dtype=torch.uint8, device=dev)
        elif not (tensor.is_cuda and tensor.is_contiguous()):
            raise InvalidArgument("CudaRegion(tensor=): expected a contiguous CUDA tensor")
        self._closed = False
        self._lease = None
        self.tensor = tensor
        self.buf = tensor.reshape(-1).view(torch.uint8)
        self.nbytes = int(self.buf.numel())
        self.device = self.buf.device
        self.region_id = None
        self._busy = False
        ptr = self.buf.data_ptr()
        handle, base, size, self.uuid = _Driver.export(ptr, self.device.index)
        with torch.cuda.device(self.device):
            self.event = torch.cuda.Event(interprocess=True)
            event_handle = self.event.ipc_handle()
        request = spb.SharedMemoryLeaseRequest(bytes=self.nbytes, cuda_ipc=spb.CudaIpcRegion(
            memory_handle=handle, offset=ptr - base, device_uuid=self.uuid,
            event_handle=event_handle))
        try:
            self._lease = Lease(client, request, timeout=timeout)
            resp = self._lease.response
            self.region_id = resp.region_id
            self.server_event = torch.cuda.Event.from_ipc_handle(self.device,
                                                                 resp.cuda_event_handle)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"CudaRegion({self.device}, {self.nbytes} bytes, id={self.region_id})"

    @property
    def alive(self):
        """True while the lease stream is open (the server holds the region)."""
        return not self._closed and self._lease is not None and self._lease.alive

    def arrays(self, total_tokens, num_heads, num_kv_heads, head_dim, dtype, *,
               append_only=False):
        """The torch views of q, k, v and o at the layout extend_packed uses for a batch of
        total_tokens rows → dict "q", "k", "v", "o" (append_only: "k", "v") of CUDA tensors
        (total_tokens, heads, head_dim) of `dtype` (a torch dtype, or "float32", "float16",
        "bfloat16"). Write inputs there to skip
        the copy, but only after the writing stream waited on the server's event
        (``torch.cuda.current_stream().wait_event(region.server_event)``): until then the
        server may still be reading the previous batch's q/k/v or writing its o there. o holds
        the last batch's output (read it after the same wait: extend_packed's o already is).
        Raises InvalidArgument when the region is too small."""
        torch = _torch()
        if isinstance(dtype, str):
            dtype = {"float32": torch.float32, "float16": torch.float16,
                     "bfloat16": torch.bfloat16}[dtype.lower()]
        q = (total_tokens, num_heads, head_dim)
        kv = (total_tokens, num_kv_heads, head_dim)
        spans = self._layout([None if append_only else q, kv, kv],
                             torch.empty((), dtype=dtype).element_size())
        return {name: self.buf[off:off + n].view(dtype).view(q if name in "qo" else kv)
                for name, (off, n) in spans.items()}

    def _layout(self, shapes, itemsize):
        spans, need = layout(shapes, itemsize)
        if need > self.nbytes:
            raise InvalidArgument(f"CUDA region {self.region_id} holds {self.nbytes} bytes; "
                                  f"this batch needs {need} (q, k, v, o at 64-byte alignment)")
        return spans

    def _stage(self, p, shapes, tensors, append_only):
        """Copies the batch's tensors (fastpath Plan p: torch CUDA on this region's device) into
        the region on the current stream, after the server's last event (its reads of the
        previous batch's inputs), then records the client's event → (layout, {name:
        (region_id, offset, bytes)}); marks the region busy."""
        import torch
        if self._closed or self.region_id is None:
            raise InvalidArgument(f"CUDA region {self.region_id} is closed")
        if self._busy:
            raise InvalidArgument(f"CUDA region {self.region_id} is in use by a batch in "
                                  "flight (one batch per region at a time)")
        if p.kind != "cuda" or p.device != self.device:
            raise InvalidArgument(f"a CudaRegion takes torch CUDA tensors on {self.device} of "
                                  f"the sequences' dtype; got {p.kind} tensors"
                                  f"{'' if p.device is None else ' on ' + str(p.device)}")
        spans = self._layout(shapes, _fp._ITEMSIZE[p.wire])
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.server_event)
        names = ("k", "v") if append_only else ("q", "k", "v")
        for name, t in zip(names, tensors):
            off, n = spans[name]
            dst = self.buf[off:off + n]
            if t.data_ptr() == dst.data_ptr() and t.is_contiguous() \
                    and t.numel() * t.element_size() == n:
                continue  # already in place (an arrays() view)
            dst.view(t.dtype).view(t.shape).copy_(t)
        self.event.record(stream)
        self._busy = True
        return spans, {name: (self.region_id, off, n) for name, (off, n) in spans.items()}

    def _read_o(self, p, spans, shape):
        """o (shape, Plan p's dtype): the current stream waits on the server's event, then o is
        cloned out of the region on it (a new CUDA tensor on this region's device)."""
        import torch
        off, n = spans["o"]
        torch.cuda.current_stream(self.device).wait_event(self.server_event)
        return self.buf[off:off + n].view(p.dtype).view(shape).clone()

    def close(self, timeout=10.0):
        """Ends the lease and waits until the server closed its mapping (the stream's end), then
        drops this object's references to the memory (torch frees it when no other reference
        remains). Idempotent. If the server does not end the stream within timeout, the lease is
        cancelled and the memory is kept referenced by this object (freeing memory another
        process may still map is undefined behaviour in CUDA)."""
        if self._closed:
            return
        self._closed = True
        ended = self._lease.close(timeout) if self._lease is not None else True
        if ended:
            self.buf = None
            self.tensor = None

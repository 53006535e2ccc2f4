"""RegionTransport: the CUDA IPC region through which an attached model's layer calls send q/k/v
and get o back (internal; ``attach(model, client, transport_region="cuda" | "auto")``).

One :class:`~attention_client.cuda_region.CudaRegion` per attached model, leased at the first
layer call that can use it and sized for the largest layer call seen: a call whose q, k, v and o
(shared_memory.layout: 64-byte aligned) do not fit closes the lease (close() waits until the
server closed its mapping) and leases one that fits, rounded up to 1 MiB. Layer calls are
already split along the tokens at LayerCalls.max_call_bytes of q+k+v, so the region never
needs more than about max_call_bytes × (q+k+v+o)/(q+k+v). A region the server no longer knows
(a request-level NOT_FOUND: a restarted server, an ended lease) is dropped and a new one leased
for the retried call (a call refused as a whole touched nothing). close() ends the lease
(AttachedModel.detach → ServerSession.close); the region is kept across conversations until
then, so one attached model pays for one lease, not one per generate.

Modes:
  "cuda"  every layer call goes through the region; raises FailedPrecondition when it cannot
          (tensors not on a CUDA device, or on another GPU than the server's; a server whose
          GetServerInfo.cuda_ipc_regions is false; no libcuda), and what a lease failed with
          (CudaRegion's errors: e.g. InvalidArgument when the two processes cannot share
          device memory, ResourceExhausted at --max-shared-memory-bytes).
  "auto"  the region when GetServerInfo reports cuda_ipc_regions and a device_uuid equal to the
          UUID of the tensors' GPU and the lease succeeds; otherwise bytes on the wire, saying
          so: one RuntimeWarning per reason (warnings.warn) and the first reason in
          ``fallback`` (SessionStats.transport_fallback). A lease that fails is not retried
          for that device (the warning says why).
In both modes a call the server would refuse through a device region goes as bytes: an FP8
sequence's first step on a layer (the server derives the layer's scales from those k/v on
the host; sequence.proto RegionSlice); those count in ``byte_calls``.
Counters: leases (regions leased: the first, each growth, each replacement), calls
(ExtendBatch calls through a region), byte_calls (calls sent as bytes meanwhile).
"""
import warnings

from .errors import AttentionError, FailedPrecondition
from .shared_memory import layout

MODES = ("cuda", "auto")
_GRAIN = 1 << 20


def region_bytes(tokens, num_heads, num_kv_heads, head_dim, itemsize):
    """Bytes a region needs for one call of `tokens` query tokens: q (tokens, num_heads,
    head_dim), k and v (tokens, num_kv_heads, head_dim), o like q, itemsize bytes an element,
    at CudaRegion's layout (each tensor 64-byte aligned)."""
    q, kv = (tokens, num_heads, head_dim), (tokens, num_kv_heads, head_dim)
    return layout([q, kv, kv], itemsize)[1]


def _device_key(device):
    """(type, index) of a torch.device; a CUDA device without index is the current one."""
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and index is None:
        import torch
        index = torch.cuda.current_device()
    return getattr(device, "type", str(device)), index


def _uuid_of(device):
    from .cuda_region import device_uuid
    return device_uuid(_device_key(device)[1])


class RegionTransport:
    """RegionTransport(client, mode, *, timeout=30.0): client an AttentionClient; mode "cuda"
    or "auto" (see the module docstring); timeout: seconds to wait for a lease.
    Attributes: mode, region (the CudaRegion in use, or None), fallback (None, or why "auto"
    sent bytes), leases, calls, byte_calls. lease(nbytes, device) and uuid_of(device) may be
    given to replace CudaRegion leases and the driver's UUID lookup (tests without a GPU)."""

    def __init__(self, client, mode, *, timeout=30.0, lease=None, uuid_of=None):
        if mode not in MODES:
            raise ValueError(f"transport_region must be None, 'cuda' or 'auto'; got {mode!r}")
        self.client = client
        self.mode = mode
        self.timeout = timeout
        self.region = None
        self.fallback = None
        self.leases = 0
        self.calls = 0
        self.byte_calls = 0
        self._why = {}       # device key → None (a region can be used) or the reason it cannot
        self._warned = set()
        self._server = None  # (cuda_ipc_regions, device_uuid) of GetServerInfo
        self._views = None   # (key, region.arrays(...)) of the last shape (views())
        self._lease = lease or (lambda nbytes, device: client.cuda_region(
            nbytes, device=device, timeout=self.timeout))
        self._uuid_of = uuid_of or _uuid_of

    def __repr__(self):
        return (f"RegionTransport({self.mode!r}, region={self.region!r}, "
                f"fallback={self.fallback!r})")

    # -- can this device use a region? ---------------------------------------------------
    def check(self, device):
        """None when layer calls from tensors on `device` (a torch.device) can go through a
        region; else the reason they go as bytes ("auto": warned once). Cached per device
        once decided. Raises FailedPrecondition ("cuda" mode) instead of returning a reason,
        and GetServerInfo's errors (e.g. Unavailable) as they are (not cached)."""
        key = _device_key(device)
        if key not in self._why:
            self._why[key] = self._reason(device)
        why = self._why[key]
        if why is not None:
            self._refuse(why)
        return why

    def _reason(self, device):
        if getattr(device, "type", None) != "cuda":
            return f"the layer call's tensors are on {device}, not on a CUDA device"
        if self._server is None:
            info = self.client.server_info()
            self._server = (bool(info.cuda_ipc_regions), str(info.device_uuid))
        accepts, server_uuid = self._server
        if not accepts:
            return ("the server does not accept CUDA IPC regions (GetServerInfo."
                    "cuda_ipc_regions is false: a CPU-only build, no GPU, or --kv-device=cpu)")
        try:
            uuid = self._uuid_of(device)
        except AttentionError as e:
            return f"the UUID of {device} cannot be read ({e.details})"
        if uuid != server_uuid:
            return (f"the layer call's tensors are on {device} ({uuid}), the server computes on "
                    f"{server_uuid or 'no GPU'} (CUDA IPC needs the same GPU)")
        return None

    def _refuse(self, why):
        if self.mode == "cuda":
            raise FailedPrecondition(f"transport_region='cuda': {why}; transport_region='auto' "
                                     "sends bytes instead")
        if self.fallback is None:
            self.fallback = why
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"attention_client: transport_region='auto' sends q/k/v/o as bytes: "
                          f"{why}", RuntimeWarning, stacklevel=4)

    # -- the region ----------------------------------------------------------------------
    def region_for(self, device, need):
        """The region for one layer call from tensors on `device` needing `need` bytes
        (region_bytes), leased, replaced or grown as needed; None: send the call as bytes
        ("auto" only). Raises as check() does, and ("cuda") what the lease failed with."""
        if self.check(device) is not None:
            return None
        r = self.region
        if r is not None and r.alive and r.nbytes >= need:
            return r
        nbytes = -(-max(int(need), 1) // _GRAIN) * _GRAIN
        self.drop()  # first: the server's --max-shared-memory-bytes counts both otherwise
        try:
            self.region = self._lease(nbytes, device)
        except Exception as e:  # noqa: BLE001 - CudaRegion's errors, torch's OutOfMemoryError
            if self.mode == "cuda":
                raise
            why = f"leasing a {nbytes}-byte CUDA IPC region on {device} failed ({e})"
            self._why[_device_key(device)] = why
            self._refuse(why)
            return None
        self.leases += 1
        return self.region

    def views(self, region, tokens, num_heads, num_kv_heads, head_dim, dtype):
        """region.arrays(...) for a call of `tokens` rows (q, k, v, o CUDA views at the layout
        extend_packed uses), cached for the last shape asked (decode steps repeat theirs)."""
        key = (id(region), tokens, num_heads, num_kv_heads, head_dim, dtype)
        cached = self._views
        if cached is None or cached[0] != key:
            cached = (key, region.arrays(tokens, num_heads, num_kv_heads, head_dim, dtype))
            self._views = cached
        return cached[1]

    def drop(self):
        """Closes the region in use, if any (waits until the server closed its mapping)."""
        r, self.region, self._views = self.region, None, None
        if r is not None:
            r.close()

    def close(self):
        """Ends the lease (idempotent; a later layer call leases again)."""
        self.drop()

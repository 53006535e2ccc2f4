"""One layer's step for a batch of rows, from torch tensors to torch tensors (internal adapter).

This is the single place where the transformers integration (session.py,
transformers_integration.py) and bench/frontend_bench.py touch the client's wire API: they
hand over whole-batch torch tensors and get a whole-batch torch tensor back. Today it goes
through the public ``AttentionClient.extend_batch`` / ``create_sequence``; switching to a
faster client path changes only :meth:`LayerCalls.extend_layer`.

Conversion done here, once per call: q/k/v are made contiguous in (B, T, heads, H) on their
device and copied to host memory in one copy each; rows are views of those copies. With
``ml_dtypes`` installed, bf16 rows go to the client as ``ml_dtypes.bfloat16`` numpy views (their
bytes are sent as they are); without it, bf16 rows go as torch tensors (the client widens them to
float32 and re-encodes). fp16/fp32 rows go as numpy views. The outputs are gathered into one
host tensor and copied to q's device in one copy.
"""
import dataclasses
import time

import numpy as np

from .errors import AttentionError

try:  # optional: bf16 numpy views (zero-copy); without it bf16 goes through the torch path
    import ml_dtypes as _ml_dtypes
except Exception:  # pragma: no cover - depends on the environment
    _ml_dtypes = None


@dataclasses.dataclass
class CallTiming:
    """Timers of one extend_layer call (microseconds; wall clock of this process).

    convert_us: this adapter's torch work (device layout change, device→host copies, views,
    output gather and host→device copy, synchronised). call_us: the client's extend_batch
    (the client's own encoding and decoding, gRPC transport, the server). server: per-phase
    maxima over the call's steps of the server's ExecutionReport times (decode, queue,
    host_to_device, kernel, device_to_host, encode, total); steps of one ExtendBatch run
    concurrently on the server, so the maximum is the call's critical path. rows: steps sent.
    tokens: query tokens sent.
    """
    convert_us: float = 0.0
    call_us: float = 0.0
    server: dict = dataclasses.field(default_factory=dict)
    rows: int = 0
    tokens: int = 0


def _host_rows(x, torch):
    """(B, T, heads, H) tensor → contiguous host copy (one device→host copy)."""
    x = x.contiguous()
    if x.device.type != "cpu":
        x = x.to("cpu")
    return x


def _as_wire(t, torch):
    """A host row (T, heads, H) → what the client accepts without a float32 detour when it
    can: numpy views for fp32/fp16, ml_dtypes bf16 views when ml_dtypes is installed, else the
    torch tensor itself."""
    if t.dtype == torch.bfloat16:
        if _ml_dtypes is None:
            return t
        return t.contiguous().view(torch.int16).numpy().view(_ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def _from_wire(o, like_dtype, torch):
    """The client's output (numpy array or torch tensor, (T, N, H)) → host torch tensor of
    like_dtype."""
    if isinstance(o, np.ndarray):
        if o.dtype.name == "bfloat16":
            return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(o).to(like_dtype)
    return o.to(device="cpu", dtype=like_dtype)


class LayerCalls:
    """Sequence creation and one ExtendBatch per layer call for a batch of rows.

    LayerCalls(client, *, timeout=None): client is an attention_client.AttentionClient;
    timeout: per-call deadline in seconds (None: the client's default).
    Attributes: timings: list of CallTiming, one per extend_layer call, appended while
    ``record`` is True (off by default; the benchmark turns it on).
    """

    def __init__(self, client, *, timeout=None):
        import torch  # noqa: F401  (the integration needs torch; fail here with its message)
        self.client = client
        self.timeout = timeout
        self.record = False
        self.timings = []

    def create(self, *, num_layers, num_heads, num_kv_heads, head_dim, dtype,
               kv_cache_dtype=None, scale=None, reserve_tokens=0):
        """CreateSequence → attention_client.Sequence (dtype: a torch dtype or name).
        Raises the client's AttentionError subclasses (InvalidArgument, FailedPrecondition:
        e.g. a head dim the GPU KV cache does not serve, ResourceExhausted)."""
        return self.client.create_sequence(
            num_layers, num_heads, num_kv_heads, head_dim, dtype=str(dtype),
            kv_cache_dtype=kv_cache_dtype, reserve_tokens=reserve_tokens, scale=scale,
            timeout=self.timeout)

    def extend_layer(self, layer, seqs, positions, q, k, v, select=None):
        """One layer's step for every row b with seqs[b] not None, in one ExtendBatch.

        layer: layer index. seqs: B entries, Sequence or None (row not sent; its output rows
        are zeros). positions: B ints (where row b's new tokens go; ignored for None rows).
        q: (B, T, N, H), k and v: (B, T, K, H) torch tensors of the sequences' dtype, any
        device. select: None (every one of the T tokens of each row) or B entries, each None
        (all T) or a 1-D sequence of token indices in [0, T) (the tokens of row b that are
        sent, in order; an empty one means the row is not sent).
        Returns (o, failures): o (B, T, N, H) of q's dtype and device, zeros where nothing
        was sent; failures: {row: AttentionError} for steps the server refused (their
        output rows are zeros). Raises AttentionError for request-level failures.
        """
        import torch
        t0 = time.perf_counter()
        B, T = q.shape[0], q.shape[1]
        qh, kh, vh = (_host_rows(x, torch) for x in (q, k, v))
        rows, steps = [], []
        for b in range(B):
            if seqs[b] is None:
                continue
            idx = None if select is None else select[b]
            if idx is not None and len(idx) == 0:
                continue
            if idx is None or len(idx) == T:
                qb, kb, vb = qh[b], kh[b], vh[b]
                idx = None
            else:
                it = torch.as_tensor(idx, dtype=torch.long)
                qb, kb, vb = qh[b].index_select(0, it), kh[b].index_select(0, it), \
                    vh[b].index_select(0, it)
            rows.append((b, idx, qb.shape[0]))
            steps.append((seqs[b], layer, int(positions[b]), _as_wire(qb, torch),
                          _as_wire(kb, torch), _as_wire(vb, torch)))
        t1 = time.perf_counter()
        results = self.client.extend_batch(steps, timeout=self.timeout) if steps else []
        t2 = time.perf_counter()
        out = torch.zeros(qh.shape, dtype=q.dtype)
        failures = {}
        server = {}
        for (b, idx, _), r in zip(rows, results):
            if isinstance(r, AttentionError):
                failures[b] = r
                continue
            ob = _from_wire(r.o, q.dtype, torch)
            if idx is None:
                out[b] = ob
            else:
                out[b].index_copy_(0, torch.as_tensor(idx, dtype=torch.long), ob)
            for name, us in r.report.times_us.items():
                server[name] = max(server.get(name, 0), us)
        if q.device.type != "cpu":
            out = out.to(q.device)
            if q.device.type == "cuda":
                torch.cuda.synchronize(q.device)
        t3 = time.perf_counter()
        if self.record:
            self.timings.append(CallTiming(
                convert_us=((t1 - t0) + (t3 - t2)) * 1e6, call_us=(t2 - t1) * 1e6,
                server=server, rows=len(rows), tokens=sum(n for _, _, n in rows)))
        return out, failures

"""One layer's step for a batch of rows, from torch tensors to torch tensors (internal adapter).

This is the single place where the transformers integration (session.py,
transformers_integration.py) and bench/frontend_bench.py touch the client's wire API: they
hand over whole-batch torch tensors and get a whole-batch torch tensor back. Today it goes
through the public ``AttentionClient.extend_batch`` / ``create_sequence``; switching to a
faster client path changes only :meth:`LayerCalls.extend_layer`.

Whole rows (every row sends all its T tokens and the call fits max_call_bytes: decode steps and
most prefills): q/k/v are made contiguous in (B, T, heads, H) on their device and handed to
``extend_batch`` as they are, so the client's fast path gathers them with one device→host copy
into pinned memory, sends the bytes as they are (bf16 stays bf16) and returns every o as a view
of one tensor on q's device (one host→device copy); the B outputs are stacked into one tensor.
Otherwise (padding rows left out, big prefills split along the tokens): q/k/v are copied to
host memory once each, rows are views of those copies (numpy views, ml_dtypes bf16 views, or
torch tensors), and the outputs are gathered on the host and copied to q's device once.
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
    tokens: query tokens sent. client: the client call's own phases (µs, summed over the calls
    of a split step; extend_batch's timings=): gather_us (tensor views; for CUDA the one
    device→host copy), encode_us (request bytes/message), rpc_us (gRPC call and server; on the
    protobuf path also protobuf's serialisation and parsing), decode_us (reading the reply),
    scatter_us (o into the output buffer; for CUDA the one host→device copy).
    """
    convert_us: float = 0.0
    call_us: float = 0.0  # summed over the calls when a big step was split
    server: dict = dataclasses.field(default_factory=dict)
    client: dict = dataclasses.field(default_factory=dict)
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

    LayerCalls(client, *, timeout=None, max_call_bytes=128 MiB): client is an
    attention_client.AttentionClient; timeout: per-call deadline in seconds (None: the
    client's default); max_call_bytes: q+k+v bytes above which one layer's step is split into
    several ExtendBatch calls along the tokens (keep it under the server's
    --max-message-bytes, default 256 MiB).
    Attributes: timings: list of CallTiming, one per extend_layer call, appended while
    ``record`` is True (off by default; the benchmark turns it on); rpcs: ExtendBatch calls
    sent so far.
    """

    def __init__(self, client, *, timeout=None, max_call_bytes=128 << 20):
        import torch  # noqa: F401  (the integration needs torch; fail here with its message)
        self.client = client
        self.timeout = timeout
        self.max_call_bytes = int(max_call_bytes)
        self.record = False
        self.timings = []
        self.rpcs = 0  # ExtendBatch calls sent (a split step counts each of its calls)

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
        A request larger than max_call_bytes (a big prefill) is split along the tokens into
        several ExtendBatch calls, each carrying the next chunk of every row (same result:
        chunk j attends over everything appended before it).
        Returns (o, failures): o (B, T, N, H) of q's dtype and device, zeros where nothing
        was sent; failures: {row: AttentionError} for steps the server refused (their
        output rows are zeros; later chunks of such a row are not sent). Raises
        AttentionError for request-level failures.
        """
        import torch
        t0 = time.perf_counter()
        B, T = q.shape[0], q.shape[1]
        per_token = (q.shape[2] + 2 * k.shape[2]) * q.shape[3] * q.element_size()
        if (select is None and all(s is not None for s in seqs)
                and B * T * per_token <= self.max_call_bytes):
            return self._extend_whole_rows(layer, seqs, positions, q, k, v, t0)
        qh, kh, vh = (_host_rows(x, torch) for x in (q, k, v))
        rows = []  # (b, token indices or None, count)
        for b in range(B):
            if seqs[b] is None:
                continue
            idx = None if select is None else select[b]
            if idx is not None and len(idx) == 0:
                continue
            if idx is not None and len(idx) == T:
                idx = None
            rows.append((b, None if idx is None else torch.as_tensor(idx, dtype=torch.long),
                         T if idx is None else len(idx)))
        total = sum(n for _, _, n in rows) * per_token
        chunk = max(1, self.max_call_bytes // max(1, len(rows) * per_token)) \
            if total > self.max_call_bytes else max([n for _, _, n in rows] or [1])
        out = torch.zeros(qh.shape, dtype=q.dtype)
        failures, server, phases = {}, {}, {}
        convert, call = time.perf_counter() - t0, 0.0
        for j0 in range(0, max([n for _, _, n in rows] or [0]), chunk):
            t1 = time.perf_counter()
            part, steps = [], []
            for b, idx, n in rows:
                if n <= j0 or b in failures:
                    continue
                j1 = min(n, j0 + chunk)
                it = torch.arange(j0, j1) if idx is None else idx[j0:j1]
                whole = idx is None and j0 == 0 and j1 == T
                qb, kb, vb = (x[b] if whole else x[b].index_select(0, it) for x in (qh, kh, vh))
                part.append((b, None if whole else it))
                steps.append((seqs[b], layer, int(positions[b]) + j0, _as_wire(qb, torch),
                              _as_wire(kb, torch), _as_wire(vb, torch)))
            t2 = time.perf_counter()
            results = []
            if steps:
                self.rpcs += 1
                results = self.client.extend_batch(steps, timeout=self.timeout,
                                                   timings=phases)
            t3 = time.perf_counter()
            for (b, it), r in zip(part, results):
                if isinstance(r, AttentionError):
                    failures[b] = r
                    continue
                ob = _from_wire(r.o, q.dtype, torch)
                if it is None:
                    out[b] = ob
                else:
                    out[b].index_copy_(0, it, ob)
                for name, us in r.report.times_us.items():
                    server[name] = max(server.get(name, 0), us)
            convert += (t2 - t1) + (time.perf_counter() - t3)
            call += t3 - t2
        t4 = time.perf_counter()
        if q.device.type != "cpu":
            out = out.to(q.device)
            if q.device.type == "cuda":
                torch.cuda.synchronize(q.device)
        convert += time.perf_counter() - t4
        if self.record:
            self.timings.append(CallTiming(
                convert_us=convert * 1e6, call_us=call * 1e6, server=server, rows=len(rows),
                tokens=sum(n for _, _, n in rows), client=phases))
        return out, failures

    def _extend_whole_rows(self, layer, seqs, positions, q, k, v, t0):
        """extend_layer when every row sends all its T tokens in one call (decode steps and
        prefills under max_call_bytes): the tensors go to the client as they are, on their
        device, so its fast path gathers all 3·B of them with one device→host copy and
        returns every o as a view of one tensor on q's device (one host→device copy); here
        only the (B, T, heads, H) layout is made contiguous (3 copies on the device) and the
        B outputs are stacked (one)."""
        import torch
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        steps = [(seqs[b], layer, int(positions[b]), qc[b], kc[b], vc[b])
                 for b in range(q.shape[0])]
        t1 = time.perf_counter()
        self.rpcs += 1
        phases = {}
        results = self.client.extend_batch(steps, timeout=self.timeout, timings=phases)
        t2 = time.perf_counter()
        failures, server = {}, {}
        outs = []
        for b, r in enumerate(results):
            if isinstance(r, AttentionError):
                failures[b] = r
                outs.append(torch.zeros_like(qc[b]))
                continue
            o = r.o if _is_torch_tensor(r.o, torch) else _from_wire(r.o, q.dtype, torch)
            outs.append(o.to(device=q.device, dtype=q.dtype))
            for name, us in r.report.times_us.items():
                server[name] = max(server.get(name, 0), us)
        out = torch.stack(outs)
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
        t3 = time.perf_counter()
        if self.record:
            self.timings.append(CallTiming(
                convert_us=((t1 - t0) + (t3 - t2)) * 1e6, call_us=(t2 - t1) * 1e6,
                server=server, rows=len(steps), tokens=len(steps) * q.shape[1],
                client=phases))
        return out, failures


def _is_torch_tensor(x, torch):
    return isinstance(x, torch.Tensor)

"""One layer's step for a batch of rows, from torch tensors to torch tensors (internal adapter).

This is the single place where the transformers integration (session.py,
transformers_integration.py) and bench/frontend_bench.py touch the client's wire API: they
hand over whole-batch torch tensors and get a whole-batch torch tensor back. Each layer call
is one packed ExtendBatch (``AttentionClient.extend_packed``): one q, one k and one v tensor
for all rows, one o back, so there is no per-row slicing and no per-step sub-message.

Whole rows (every row sends all its T tokens and the call fits max_call_bytes: decode steps
and most prefills): q/k/v (B, T, heads, H) are made contiguous on their device and viewed as
(B·T, heads, H); the client's fast path copies them with one device→host copy into pinned
memory, sends the bytes as they are (bf16 stays bf16) and returns o (B·T, N, H) with one
host→device copy, viewed back as (B, T, N, H) (rows of refused steps are zeros).
Otherwise (padding tokens left out, rows not sent, big prefills split along the tokens): the
tokens each call sends are picked on the device with one index_select per q/k/v (the
flattened (B·T) token indices from :func:`plan_chunks`), and each o is put back with one
index_copy_ into a zero (B·T, N, H) tensor on q's device.
Through a CUDA IPC region (a RegionTransport: attach(..., transport_region="cuda"/"auto")):
the same calls, but q/k/v are written straight into the region's views on the current stream
(one copy_ or index_select(out=) per tensor, device to device), the messages carry slices
only, and o is cloned out of the region on the device; nothing crosses the host.
"""
import dataclasses
import time

from ._pb import attention_pb2 as pb
from .errors import AttentionError, NotFound
from .region_transport import region_bytes


@dataclasses.dataclass
class CallTiming:
    """Timers of one extend_layer call (microseconds; wall clock of this process).

    convert_us: this adapter's torch work (device layout change, token gather with
    index_select, output index_copy_, synchronised). call_us: the client's extend_packed
    (the client's own encoding and decoding, gRPC transport, the server). server: per-phase
    maxima over the calls of the server's batch ExecutionReport times (decode, queue,
    host_to_device, kernel, device_to_host, encode, total; a packed batch's report has the
    times of its slowest step: the call's critical path; the device phases are absent when the
    server did not time them, Report.device_timed). rows: steps sent.
    tokens: query tokens sent. client: the client call's own phases (µs, summed over the calls
    of a split step; extend_packed's timings=): gather_us (tensor views; for CUDA the one
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


def plan_chunks(B, T, present, select, per_token, max_call_bytes):
    """Which tokens each call of one layer step sends (pure Python; no torch needed).

    B, T: batch rows and tokens per row; present: B bools (False: row not sent); select: None
    or B entries, None (all T tokens) or a sequence of token indices in [0, T) (an empty one:
    row not sent); per_token: q+k+v bytes of one token; max_call_bytes: the limit of one call.
    Returns (rows, chunks): rows, the rows sent as (b, token indices), in order; chunks: the
    calls, each a list of (b, j0, tokens) with j0 the offset of the call's first token among
    row b's sent tokens (its Extend position is the row's position + j0) and tokens the row's
    token indices sent in that call. When everything fits one call there is one chunk of
    every row's tokens; otherwise chunk c carries tokens [c·n, (c+1)·n) of every row that has
    them, n = max_call_bytes // (rows · per_token) (at least 1)."""
    rows = []
    for b in range(B):
        if not present[b]:
            continue
        idx = list(range(T)) if select is None or select[b] is None else \
            [int(i) for i in select[b]]
        if idx:
            rows.append((b, idx))
    longest = max([len(i) for _, i in rows] or [0])
    total = sum(len(i) for _, i in rows) * per_token
    n = longest if total <= max_call_bytes else \
        max(1, max_call_bytes // max(1, len(rows) * per_token))
    chunks = [[(b, j0, idx[j0:j0 + n]) for b, idx in rows if len(idx) > j0]
              for j0 in range(0, longest, max(n, 1))]
    return rows, chunks


def _fp8_first_step(steps):
    """True when a step is an FP8 sequence's first on its layer (position 0): the server takes
    the layer's scales from those k/v on the host, so such a call goes as bytes, never through
    a CUDA IPC region (sequence.proto RegionSlice)."""
    return any(pos == 0 and seq.info.kv_cache_dtype == pb.FLOAT8_E4M3 for seq, pos, _ in steps)


class _Inputs:
    """One layer step's q, k, v (B, T, heads, H) and what one call sends of them."""

    def __init__(self, q, k, v):
        self.src = (q, k, v)
        self._flat = None

    def flat(self):
        """q, k, v made contiguous and viewed as (B·T, heads, H) (computed once)."""
        if self._flat is None:
            self._flat = [x.contiguous().reshape(x.shape[0] * x.shape[1], x.shape[2],
                                                 x.shape[3]) for x in self.src]
        return self._flat

    def gather(self, it, region, transport, n, dims):
        """(q, k, v) of one call of n tokens: it, the flattened (B·T) indices of its tokens
        (None: all). Without a region: tensors (index_select on q's device). With one: written
        into the region's views (one copy_ or index_select(out=) each, current stream) and
        those views returned (extend_packed then copies nothing), after the stream waited on
        the server's event (its last access to the region, the previous call's)."""
        import torch
        if region is None:
            flat = self.flat()
            return flat if it is None else [x.index_select(0, it) for x in flat]
        views = transport.views(region, n, *dims, self.src[0].dtype)
        torch.cuda.current_stream(region.device).wait_event(region.server_event)
        out = [views[name] for name in "qkv"]
        if it is None:
            for dst, x in zip(out, self.src):
                dst.view(x.shape).copy_(x)
        else:
            for dst, x in zip(out, self.flat()):
                torch.index_select(x, 0, it, out=dst)
        return out


_DEVICE_PHASES = ("host_to_device", "kernel", "device_to_host")


def _merge_server(server, report):
    # A step the server ran without device timing (--kv-timing-every) has no device phases:
    # they stay absent rather than 0.
    for name, us in report.times_us.items():
        if report.device_timed or name not in _DEVICE_PHASES:
            server[name] = max(server.get(name, 0), us)


class LayerCalls:
    """Sequence creation and one ExtendBatch per layer call for a batch of rows.

    LayerCalls(client, *, timeout=None, max_call_bytes=128 MiB): client is an
    attention_client.AttentionClient; timeout: per-call deadline in seconds (None: the
    client's default); max_call_bytes: q+k+v bytes above which one layer's step is split into
    several ExtendBatch calls along the tokens (keep it under the server's
    --max-message-bytes, default 256 MiB; the same splitting bounds a CUDA IPC region's
    size); transport: None (q/k/v/o as bytes in the messages) or a
    :class:`~attention_client.region_transport.RegionTransport` (through a CUDA IPC region
    where it can; its counters say how many calls did).
    Attributes: timings: list of CallTiming, one per extend_layer call, appended while
    ``record`` is True (off by default; the benchmark turns it on); rpcs: ExtendBatch calls
    sent so far.
    """

    def __init__(self, client, *, timeout=None, max_call_bytes=128 << 20, transport=None):
        import torch  # noqa: F401  (the integration needs torch; fail here with its message)
        self.client = client
        self.transport = transport
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
        """One layer's step for every row b with seqs[b] not None, in one packed ExtendBatch.

        layer: layer index. seqs: B entries, Sequence or None (row not sent; its output rows
        are zeros). positions: B ints (where row b's new tokens go; ignored for None rows).
        q: (B, T, N, H), k and v: (B, T, K, H) torch tensors of the sequences' dtype, any
        device. select: None (every one of the T tokens of each row) or B entries, each None
        (all T) or a 1-D sequence of token indices in [0, T) (the tokens of row b that are
        sent, in order; an empty one means the row is not sent).
        A request larger than max_call_bytes (a big prefill) is split along the tokens into
        several ExtendBatch calls, each carrying the next chunk of every row (same result:
        chunk j attends over everything appended before it).
        With a transport (RegionTransport) whose region the call can use, q/k/v are written
        into the CUDA IPC region on the current stream (one copy or index_select each, no
        host copy) and o is cloned out of it; the region grows to the largest call. A region
        call that raised ends the lease (closing waits until the server is done with it); one
        refused as a whole with NOT_FOUND (the server no longer knows the region) is sent
        once more through a new lease.
        Returns (o, failures): o (B, T, N, H) of q's dtype and device, zeros where nothing
        was sent; failures: {row: AttentionError} for steps the server refused (their
        output rows are zeros; later chunks of such a row are not sent). Raises
        AttentionError for request-level failures (the same on both transports), and
        FailedPrecondition when the transport is "cuda" and cannot be used here.
        """
        import torch
        t0 = time.perf_counter()
        B, T = q.shape[0], q.shape[1]
        dims = (int(q.shape[2]), int(k.shape[2]), int(q.shape[3]))
        per_token = (dims[0] + 2 * dims[1]) * dims[2] * q.element_size()
        rows, chunks = plan_chunks(B, T, [s is not None for s in seqs], select, per_token,
                                   self.max_call_bytes)
        whole = len(chunks) == 1 and len(rows) == B and all(len(i) == T for _, i in rows)
        tr = self.transport
        if tr is not None and tr.check(q.device) is not None:
            tr = None  # "auto" fell back to bytes for this device (and said so)
        src = _Inputs(q, k, v)
        out = None if whole else q.new_zeros((B * T,) + tuple(q.shape[2:]))
        failures, server, phases = {}, {}, {}
        convert, call = time.perf_counter() - t0, 0.0
        for chunk in chunks:
            t1 = time.perf_counter()
            chunk = [c for c in chunk if c[0] not in failures]
            if not chunk:
                continue
            steps = [(seqs[b], int(positions[b]) + j0, len(toks)) for b, j0, toks in chunk]
            n = sum(len(toks) for _, _, toks in chunk)
            it = None if whole else torch.tensor(
                [b * T + t for b, _, toks in chunk for t in toks], dtype=torch.long,
                device=q.device)
            region = need = None
            if tr is not None and not _fp8_first_step(steps):
                need = region_bytes(n, *dims, q.element_size())
                region = tr.region_for(q.device, need)
            qkv = src.gather(it, region, tr, n, dims)
            t2 = time.perf_counter()
            for attempt in range(2):
                try:
                    r = self._packed(layer, steps, qkv, region, phases)
                    break
                except Exception as e:
                    if region is None:
                        raise
                    # After a timeout the server may still use the region: closing the lease
                    # waits until it closed its mapping; the next call leases a new one.
                    tr.drop()
                    if attempt or not isinstance(e, NotFound):
                        raise
                # NOT_FOUND as a whole: the server does not know the region (restarted, lease
                # ended) and ran nothing; send the call once more through a new lease
                region = tr.region_for(q.device, need)
                qkv = src.gather(it, region, tr, n, dims)
            t3 = time.perf_counter()
            for (b, _, _), res in zip(chunk, r.steps):
                if isinstance(res, AttentionError):
                    failures[b] = res
            _merge_server(server, r.report)
            o = r.o.to(device=q.device, dtype=q.dtype)
            if whole:
                out = o
            else:
                out.index_copy_(0, it, o)
            convert += (t2 - t1) + (time.perf_counter() - t3)
            call += t3 - t2
        t4 = time.perf_counter()
        if out is None:  # every row refused in the one whole call: nothing came back
            out = q.new_zeros((B * T,) + tuple(q.shape[2:]))
        if failures and whole:
            for b in failures:
                out[b * T:(b + 1) * T].zero_()
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
        convert += time.perf_counter() - t4
        if self.record:
            self.timings.append(CallTiming(
                convert_us=convert * 1e6, call_us=call * 1e6, server=server, rows=len(rows),
                tokens=sum(len(i) for _, i in rows), client=phases))
        return out.reshape(q.shape), failures

    def _packed(self, layer, steps, qkv, region, phases):
        """One ExtendBatch (through `region` when not None) → PackedResult; counts it."""
        self.rpcs += 1
        if region is not None:
            self.transport.calls += 1
        elif self.transport is not None:
            self.transport.byte_calls += 1
        return self.client.extend_packed(layer, steps, *qkv, region=region,
                                         timeout=self.timeout, timings=phases)

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
"""
import dataclasses
import time

from .errors import AttentionError


@dataclasses.dataclass
class CallTiming:
    """Timers of one extend_layer call (microseconds; wall clock of this process).

    convert_us: this adapter's torch work (device layout change, token gather with
    index_select, output index_copy_, synchronised). call_us: the client's extend_packed
    (the client's own encoding and decoding, gRPC transport, the server). server: per-phase
    maxima over the calls of the server's batch ExecutionReport times (decode, queue,
    host_to_device, kernel, device_to_host, encode, total; a packed batch's report has the
    times of its slowest step: the call's critical path). rows: steps sent.
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


def _merge_server(server, report):
    for name, us in report.times_us.items():
        server[name] = max(server.get(name, 0), us)


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
        Returns (o, failures): o (B, T, N, H) of q's dtype and device, zeros where nothing
        was sent; failures: {row: AttentionError} for steps the server refused (their
        output rows are zeros; later chunks of such a row are not sent). Raises
        AttentionError for request-level failures.
        """
        import torch
        t0 = time.perf_counter()
        B, T = q.shape[0], q.shape[1]
        per_token = (q.shape[2] + 2 * k.shape[2]) * q.shape[3] * q.element_size()
        rows, chunks = plan_chunks(B, T, [s is not None for s in seqs], select, per_token,
                                   self.max_call_bytes)
        flat = [x.contiguous().reshape(B * T, x.shape[2], x.shape[3]) for x in (q, k, v)]
        whole = len(chunks) == 1 and len(rows) == B and all(len(i) == T for _, i in rows)
        out = None if whole else torch.zeros_like(flat[0])
        failures, server, phases = {}, {}, {}
        convert, call = time.perf_counter() - t0, 0.0
        for chunk in chunks:
            t1 = time.perf_counter()
            chunk = [c for c in chunk if c[0] not in failures]
            if not chunk:
                continue
            steps = [(seqs[b], int(positions[b]) + j0, len(toks)) for b, j0, toks in chunk]
            if whole:
                qs, ks, vs = flat
            else:
                it = torch.tensor([b * T + t for b, _, toks in chunk for t in toks],
                                  dtype=torch.long, device=q.device)
                qs, ks, vs = (x.index_select(0, it) for x in flat)
            t2 = time.perf_counter()
            self.rpcs += 1
            r = self.client.extend_packed(layer, steps, qs, ks, vs, timeout=self.timeout,
                                          timings=phases)
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
            out = torch.zeros_like(flat[0])
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

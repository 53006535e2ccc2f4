"""Server-held KV cache for a batch of rows: one server sequence per row (model-agnostic part).

A :class:`ServerSession` owns one attention-server sequence per batch row of the current
conversation (a ``generate`` call, or a chain of forward calls sharing a cache), knows each
row's length per layer (the Extend positions come from here, never from the model), sends
one ExtendBatch per layer call for all rows (through :class:`~attention_client.layer_calls.
LayerCalls`), and keeps each row's token ids and positions so that a sequence the server lost
can be rebuilt. The transformers glue (transformers_integration.py) drives it; the bench uses
its counters.

Step protocol (what the glue calls, in order, for one forward pass):
  begin(batch_size, num_layers)      new conversation: releases the previous sequences
  start_step(select)                 which tokens of each row are real (padding is never sent)
  extend(layer, q, k, v) → o         once per layer; sequences are created on the first call
  commit_step(token_ids, positions)  after the forward pass succeeded
  rollback_step()                    after it failed: rows that appended are truncated back
Recovery: extend raises :class:`RowsLost` when steps got NOT_FOUND; the glue rolls the step
back, calls :meth:`recreate` for those rows, re-prefills them from :meth:`history`, and runs
the step again (or raises :class:`SequenceLost` when recovery is "raise").
"""
import dataclasses

from .errors import AttentionError, NotFound
from .layer_calls import LayerCalls
from .region_transport import RegionTransport


class SequenceLost(NotFound):
    """A row's server sequence is gone (evicted, expired, released elsewhere, replica restarted:
    NOT_FOUND) and the session was told not to rebuild it (recovery="raise"), or could not.
    Attributes: rows (batch rows), plus NotFound's code/details/method."""

    def __init__(self, details, rows, cause=None):
        super().__init__(details, getattr(cause, "code", None), getattr(cause, "method", None))
        self.rows = list(rows)


class RowsLost(Exception):
    """Internal: raised out of a forward pass when steps got NOT_FOUND. rows: {row: error}."""

    def __init__(self, rows):
        super().__init__(f"sequences lost for rows {sorted(rows)}")
        self.rows = rows


@dataclasses.dataclass
class _Row:
    seq: object = None          # attention_client.Sequence, or None until created
    lens: list = None           # tokens per layer on the server, as this session knows them
    start: int = 0              # length (every layer) when the current step started
    tokens: list = dataclasses.field(default_factory=list)     # committed real token ids
    positions: list = dataclasses.field(default_factory=list)  # their position ids
    replayable: bool = True     # False once a step came as embeddings (no ids to re-prefill)


@dataclasses.dataclass
class SessionStats:
    """Counters since the session was made: extend_calls (layer calls, one per layer per
    forward pass; LayerCalls.rpcs counts the ExtendBatch calls, more where a big step was
    split), extend_steps (row × layer steps the server accepted),
    tokens (query tokens it accepted), created and released sequences, recoveries (rows
    rebuilt), rollbacks (steps undone). With transport_region set: region_calls (ExtendBatch
    calls whose q/k/v/o went through the CUDA IPC region), byte_calls (ExtendBatch calls sent
    as bytes all the same: "auto" fell back, or an FP8 layer's first step), region_leases
    (regions leased: the first, each growth, each replacement of a lost one),
    transport_fallback (None, or why "auto" sends bytes; also warned once)."""
    extend_calls: int = 0
    extend_steps: int = 0
    tokens: int = 0
    created: int = 0
    released: int = 0
    recoveries: int = 0
    rollbacks: int = 0
    region_calls: int = 0
    byte_calls: int = 0
    region_leases: int = 0
    transport_fallback: str = None


class ServerSession:
    """Sequences on one attention-server for the rows of a batch.

    ServerSession(client, *, recovery="reprefill", kv_cache_dtype=None, reserve_tokens=0,
                  timeout=None, max_recoveries=3, max_call_bytes=128 MiB,
                  transport_region=None)
    client: AttentionClient. recovery: "reprefill" (re-create a lost sequence and re-prefill
    it from the row's tokens) or "raise" (raise SequenceLost). kv_cache_dtype: the sequences'
    page dtype (None: their dtype; "float8_e4m3"). reserve_tokens: tokens per layer reserved
    at creation. timeout: per-call deadline in seconds. max_recoveries: rebuild attempts per
    step before SequenceLost. max_call_bytes: see LayerCalls (a bigger layer step is split
    into several ExtendBatch calls along the tokens). transport_region: None (bytes in the
    messages), "cuda" or "auto" (a CUDA IPC region: region_transport.RegionTransport), kept
    until close().
    """

    def __init__(self, client, *, recovery="reprefill", kv_cache_dtype=None, reserve_tokens=0,
                 timeout=None, max_recoveries=3, max_call_bytes=128 << 20,
                 transport_region=None):
        if recovery not in ("reprefill", "raise"):
            raise ValueError(f"recovery must be 'reprefill' or 'raise'; got {recovery!r}")
        transport = None if transport_region in (None, "none") else \
            RegionTransport(client, transport_region)
        self.client = client
        self.calls = LayerCalls(client, timeout=timeout, max_call_bytes=max_call_bytes,
                                transport=transport)
        self.recovery = recovery
        self.kv_cache_dtype = kv_cache_dtype
        self.reserve_tokens = int(reserve_tokens)
        self.max_recoveries = int(max_recoveries)
        self.stats = SessionStats()
        self.rows = []
        self.num_layers = 0
        self.spec = None        # (num_heads, num_kv_heads, head_dim, dtype, scale) in use
        self.generation = 0     # bumped by release(); caches of older generations are stale
        self.route = None       # batch index → row (None: identity); re-prefill maps 0 → row
        self.select = None      # per batch index: None (all tokens) or real token indices
        self.layer_calls_this_step = 0

    # -- conversation ---------------------------------------------------------------------
    def begin(self, batch_size, num_layers):
        """Start a new conversation of batch_size rows: releases the previous sequences."""
        self.release()
        self.num_layers = int(num_layers)
        self.rows = [_Row(lens=[0] * self.num_layers) for _ in range(int(batch_size))]
        self.spec = None

    def release(self):
        """Release every row's sequence (NotFound ignored: already gone) and end the
        conversation (caches of it are refused from now on). Idempotent."""
        self.generation += 1
        for row in self.rows:
            if row.seq is not None:
                try:
                    row.seq.release()
                    self.stats.released += 1
                except NotFound:
                    pass
                row.seq = None
        self.rows = []

    def close(self):
        """release(), then end the CUDA IPC region's lease (transport_region; waits until the
        server closed its mapping). Idempotent; a later layer call leases again."""
        try:
            self.release()
        finally:
            t = self.calls.transport
            if t is not None:
                t.close()
                self._transport_stats()

    def check_transport(self, device):
        """With transport_region set: whether layer calls from tensors on `device` can use the
        CUDA IPC region → None, or the reason they go as bytes ("auto": warned once, in
        stats.transport_fallback). Raises FailedPrecondition ("cuda" mode) or GetServerInfo's
        errors. Without: None."""
        t = self.calls.transport
        if t is None:
            return None
        try:
            return t.check(device)
        finally:
            self._transport_stats()

    def _transport_stats(self):
        t = self.calls.transport
        st = self.stats
        st.region_calls, st.byte_calls, st.region_leases = t.calls, t.byte_calls, t.leases
        st.transport_fallback = t.fallback

    def sequence_ids(self):
        """The server sequence id of each row (None where not created yet)."""
        return [None if r.seq is None else r.seq.id for r in self.rows]

    def history(self, row):
        """(token ids, positions) committed for `row`: lists of 1-D tensors, in order."""
        return self.rows[row].tokens, self.rows[row].positions

    # -- one forward pass -----------------------------------------------------------------
    def start_step(self, select, route=None):
        """select: None or per batch index None/real token indices (see LayerCalls); route:
        None or the row of each batch index."""
        self.select = select
        self.route = route
        self.layer_calls_this_step = 0
        for row in self.rows:
            row.start = row.lens[0] if row.lens else 0

    def commit_step(self, token_ids, positions):
        """Record the step's real tokens of each row: token_ids/positions are per row 1-D
        tensors (or None when the step came as embeddings: that row can no longer be
        re-prefilled)."""
        for b, row in enumerate(self.rows):
            if token_ids is None or token_ids[b] is None:
                row.replayable = False
                continue
            if len(token_ids[b]):
                row.tokens.append(token_ids[b])
                row.positions.append(positions[b])
        self.select = None

    def rollback_step(self):
        """Undo a failed step: every row whose layers grew past the step's start length is
        truncated back to it on the server (TruncateSequence), so the step can run again.
        Returns the rows whose sequence turned out to be gone as well (NOT_FOUND)."""
        gone = []
        for b, row in enumerate(self.rows):
            if row.seq is not None and any(n > row.start for n in row.lens):
                try:
                    row.seq.truncate(row.start)
                except NotFound:
                    gone.append(b)
            row.lens = [row.start] * self.num_layers
        self.stats.rollbacks += 1
        self.select = None
        return gone

    def recreate(self, row):
        """Forget row's lost sequence and give it a fresh, empty one (created on the next
        extend). Its committed tokens stay, to be re-prefilled."""
        r = self.rows[row]
        r.seq = None
        r.lens = [0] * self.num_layers
        r.start = 0
        self.stats.recoveries += 1

    def _ensure(self, rows, spec):
        if self.spec is None:
            self.spec = spec
        elif spec != self.spec:
            raise AttentionError(
                f"attention layer call does not match the session's sequences: got (heads, "
                f"kv heads, head dim, dtype, scale) = {spec}, sequences have {self.spec}; every "
                "layer must use the same shapes, dtype and softmax scale")
        n, k, h, dtype, scale = spec
        for b in rows:
            r = self.rows[b]
            if r.seq is None:
                r.seq = self.calls.create(
                    num_layers=self.num_layers, num_heads=n, num_kv_heads=k, head_dim=h,
                    dtype=dtype, kv_cache_dtype=self.kv_cache_dtype, scale=scale,
                    reserve_tokens=self.reserve_tokens)
                self.stats.created += 1

    def extend(self, layer, q, k, v, scale):
        """One layer's step: q (B, T, N, H), k/v (B, T, K, H) torch tensors (batch index i is
        row route[i]); scale: the softmax scale (None: 1/sqrt(H)). Returns o (B, T, N, H) of
        q's dtype and device (zeros at tokens not sent). Raises RowsLost on NOT_FOUND steps,
        the step's AttentionError for any other refused step, request-level AttentionErrors
        as they are: the same on the bytes path and through a CUDA IPC region (plus, with
        transport_region="cuda", FailedPrecondition when the region cannot be used)."""
        if not 0 <= layer < self.num_layers:
            raise AttentionError(f"layer index {layer} outside [0, {self.num_layers})")
        B, T = q.shape[0], q.shape[1]
        route = self.route or list(range(B))
        if len(route) != B:
            raise AttentionError(f"attention call has batch {B}; the session has "
                                 f"{len(route)} rows (the batch must not change mid-stream)")
        spec = (int(q.shape[2]), int(k.shape[2]), int(q.shape[3]), str(q.dtype).split(".")[-1],
                None if scale is None else float(scale))
        self._ensure(route, spec)
        rows = [self.rows[r] for r in route]
        try:
            o, failures = self.calls.extend_layer(
                layer, [r.seq for r in rows], [r.lens[layer] for r in rows], q, k, v,
                self.select)
        finally:
            if self.calls.transport is not None:
                self._transport_stats()
        self.stats.extend_calls += 1
        self.layer_calls_this_step += 1
        for i, r in enumerate(rows):
            if i in failures:
                continue
            sel = None if self.select is None else self.select[i]
            n = T if sel is None else len(sel)
            if n:
                r.lens[layer] += n
                self.stats.extend_steps += 1
                self.stats.tokens += n
        if failures:
            lost = {route[i]: e for i, e in failures.items() if isinstance(e, NotFound)}
            other = {route[i]: e for i, e in failures.items() if not isinstance(e, NotFound)}
            if other:
                row, err = next(iter(other.items()))
                err.details = f"row {row} (sequence {self.rows[row].seq.id}), layer {layer}: " \
                              f"{err.details}"
                raise err
            raise RowsLost(lost)
        return o

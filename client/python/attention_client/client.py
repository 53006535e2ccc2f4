"""AttentionClient: a thin, typed Python client for attention-server (attention.v1)."""
import dataclasses
import math
from typing import Optional

import grpc
import numpy as np

from . import tensors as _t
from .ecosystems import layout_hint
from ._pb import attention_pb2 as pb
from ._pb import attention_pb2_grpc as pb_grpc
from ._pb import sequence_pb2 as spb
from ._pb import sequence_pb2_grpc as spb_grpc
from .errors import InvalidArgument, from_rpc_error
from .extend_calls import ExtendCalls, Phases
from .packed_calls import PackedCalls
from .report import Report
from .sequence import Sequence

_CAUSAL = {None: pb.CAUSAL_NONE, "none": pb.CAUSAL_NONE, "top_left": pb.CAUSAL_TOP_LEFT,
           "bottom_right": pb.CAUSAL_BOTTOM_RIGHT}
@dataclasses.dataclass
class AttendResult:
    """Result of :meth:`AttentionClient.attend`.

    o: output in q's layout, (B,T,N,H) padded or (total_q,N,H) varlen. numpy array of q's
       dtype family (float32/float16; bfloat16 → ml_dtypes.bfloat16 if installed, else
       float32), or a torch tensor of q's dtype and device when q was a torch tensor. Query
       rows past q_lengths are zeros.
    lse: float32 log-sum-exp of the scaled, masked logits, (B,N,T) or (N,total_q); -inf where
       a row sees no key; None unless return_lse=True.
    report: :class:`Report`.
    """
    o: object
    lse: Optional[np.ndarray]
    report: Report


@dataclasses.dataclass
class ExtendResult:
    """Result of one Extend step: o (T,N,H) in the sequence's dtype (as AttendResult.o),
    length (the layer's length after the step), replayed (True: an exact replay of the last
    step, nothing appended), report."""
    o: object
    length: int
    replayed: bool
    report: Report


def _lengths(x, name):
    if x is None:
        return []
    out = [int(v) for v in np.asarray(x).reshape(-1)]
    return out


_FP8_QK = {"e4m3_per_tensor": pb.Fp8Options.QK_E4M3_PER_TENSOR,
           "int8_per_token": pb.Fp8Options.QK_INT8_PER_TOKEN}
_FP8_PV = {"e4m3": pb.Fp8Options.PV_E4M3, "16bit": pb.Fp8Options.PV_16BIT}


def _fp8_options(fp8):
    """attend()'s fp8 dict (or an attention.v1.Fp8Options, sent as given) → Fp8Options;
    InvalidArgument names a bad key or value."""
    if isinstance(fp8, pb.Fp8Options):
        return fp8
    if not isinstance(fp8, dict):
        raise InvalidArgument(f"fp8 must be a dict, got {type(fp8).__name__}")
    unknown = sorted(set(fp8) - {"rotate", "smooth_k", "qk_format", "pv_format"})
    if unknown:
        raise InvalidArgument(f"fp8: unknown keys {unknown} (rotate, smooth_k, qk_format, "
                              "pv_format)")
    o = pb.Fp8Options()
    for key in ("rotate", "smooth_k"):
        if key in fp8:
            if not isinstance(fp8[key], (bool, np.bool_)):
                raise InvalidArgument(f"fp8.{key} must be a bool, got {fp8[key]!r}")
            setattr(o, key, bool(fp8[key]))
    for key, table in (("qk_format", _FP8_QK), ("pv_format", _FP8_PV)):
        if key in fp8:
            if not isinstance(fp8[key], str) or fp8[key] not in table:
                raise InvalidArgument(f"fp8.{key} must be one of {sorted(table)}, got "
                                      f"{fp8[key]!r}")
            setattr(o, key, table[fp8[key]])
    return o


class AttentionClient(ExtendCalls, PackedCalls):
    """Client for one attention-server.

    AttentionClient(target, *, timeout=60.0, identity=None, max_message_bytes=1 << 30,
                    channel=None, token=None, token_file=None, tls=False, ca_file=None,
                    cert_file=None, key_file=None, server_name=None,
                    load_balancing="round_robin")

    target: "host:port" or "dns:///host:port". timeout: default per-call deadline in seconds (None: no deadline);
    every method also takes timeout=. identity: sent as "x-attn-identity" metadata on every
    call (owner of sequences; None: anonymous). max_message_bytes: gRPC send/receive limit of
    this channel (the server has its own --max-message-bytes; over it: ResourceExhausted).
    Security (server flags --tls-cert, --tls-client-ca, --auth-token-file; README "Security"):
    token: bearer token sent as "authorization: Bearer <token>" on every call; token_file: a
    file holding the token (surrounding whitespace stripped). tls=True (implied by ca_file,
    cert_file, key_file) connects with TLS, trusting ca_file (PEM; None: the system roots);
    cert_file + key_file (PEM) present a client certificate (mutual TLS). server_name
    overrides the name checked against the server certificate (e.g. "localhost" when target is
    an IP address without an IP SAN). With a token server, the identity is the token's and
    identity= is ignored by the server.
    load_balancing: gRPC policy over the addresses the target's name resolves to.
    "round_robin" (default) spreads calls over every address and re-resolves the name when a
    connection closes (the server's --max-connection-age-s GOAWAY), so pods a headless Service
    gained since get calls; gRPC moves calls off a closing connection without an error.
    Sequences live on one replica: over a name with several replicas use ReplicaSet (routes by
    the id's replica tag) or "pick_first" (every call on one connection; after a reconnect it
    may land on another replica: NOT_FOUND naming the tags).
    Use as a context manager or call close(). Thread-safe (one gRPC channel).
    Every failed RPC raises an AttentionError subclass (see attention_client.errors).
    Attribute wire (default True): the fast path of Extend/ExtendBatch/ExtendStream builds and
    reads the wire bytes itself (attention_client.wire); False: through protobuf messages.
    Packed batches (one q/k/v tensor for many sequences): extend_packed (packed_calls.py),
    batch_stream (ExtendBatchStream, batch_stream.py), shared_region (shared_memory.py),
    cuda_region (cuda_region.py).
    """

    def __init__(self, target, *, timeout=60.0, identity=None, max_message_bytes=1 << 30,
                 channel=None, token=None, token_file=None, tls=False, ca_file=None,
                 cert_file=None, key_file=None, server_name=None,
                 load_balancing="round_robin"):
        self.target = target
        self.timeout = timeout
        self.identity = identity
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
            if not token:
                raise ValueError(f"token_file {token_file!r} is empty")
        self._token = token
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS)")
        if load_balancing not in ("round_robin", "pick_first"):
            raise ValueError(f"load_balancing must be 'round_robin' or 'pick_first', got "
                             f"{load_balancing!r}")
        opts = [("grpc.max_send_message_length", int(max_message_bytes)),
                ("grpc.max_receive_message_length", int(max_message_bytes)),
                ("grpc.lb_policy_name", load_balancing)]
        if channel is None and (tls or ca_file or cert_file):
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(
                root_certificates=read(ca_file) if ca_file else None,
                private_key=read(key_file) if key_file else None,
                certificate_chain=read(cert_file) if cert_file else None)
            if server_name:
                opts.append(("grpc.ssl_target_name_override", server_name))
            channel = self._make_channel(target, creds, opts)
        self._channel = channel or self._make_channel(target, None, opts)
        self._attn = pb_grpc.AttentionServiceStub(self._channel)
        self._seq = spb_grpc.SequenceServiceStub(self._channel)

    # -- plumbing ---------------------------------------------------------------------------
    @staticmethod
    def _make_channel(target, creds, opts):
        """A grpc channel (creds None: plaintext). AsyncAttentionClient makes grpc.aio ones."""
        if creds is None:
            return grpc.insecure_channel(target, options=opts)
        return grpc.secure_channel(target, creds, options=opts)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, stub_method, name, request, timeout, identity=None):
        md = self._metadata(identity)
        try:
            return stub_method(request, timeout=self.timeout if timeout is None else timeout,
                               metadata=md)
        except grpc.RpcError as e:
            raise from_rpc_error(e, name) from None

    # -- stateless --------------------------------------------------------------------------
    def server_info(self, *, timeout=None):
        """GetServerInfo → attention.v1.GetServerInfoResponse (protobuf message: version,
        device_name, backends[] with capabilities, default_backend, max_message_bytes,
        kv_cache, ...)."""
        return self._call(self._attn.GetServerInfo, "GetServerInfo", pb.GetServerInfoRequest(),
                          timeout)

    def load(self, *, timeout=None):
        """GetLoad → attention.v1.GetLoadResponse (protobuf message: replica (address,
        replica_tag), draining, requests_queued, requests_in_flight, sequences, KV pages per
        layout class, ...): what a router reads to place new work."""
        return self._call(self._attn.GetLoad, "GetLoad", pb.GetLoadRequest(), timeout)

    def build_request(self, q, k, v, *, causal=None, window=None, q_lengths=None,
                      kv_lengths=None, scale=None, backend=None, return_lse=False, varlen=None,
                      dtype=None, fp8=None):
        """The AttendRequest that attend() would send (see attend for the arguments)."""
        qa, qwire = _t.to_numpy(q)
        ka, kwire = _t.to_numpy(k)
        va, vwire = _t.to_numpy(v)
        if dtype is not None:
            wire = _t.wire_dtype(dtype)
        else:
            wire = qwire if qwire is not None else _t.natural_wire_dtype(qa)
        varlen = _t.attend_layout({"q": qa.shape, "k": ka.shape, "v": va.shape}, varlen)
        if isinstance(causal, bool):
            raise InvalidArgument("causal must be None, 'top_left' or 'bottom_right' "
                                  "(not a bool: say which alignment)")
        if causal not in _CAUSAL:
            raise InvalidArgument(f"causal must be None, 'top_left' or 'bottom_right'; "
                                  f"got {causal!r}")
        mask = pb.Mask(causal=_CAUSAL[causal])
        if window is not None:
            left, right = window
            if left is not None:
                mask.window_left = int(left)
            if right is not None:
                mask.window_right = int(right)
        req = pb.AttendRequest(
            layout=pb.LAYOUT_VARLEN if varlen else pb.LAYOUT_PADDED,
            q=_t.encode(qa, wire, "q"), k=_t.encode(ka, wire, "k"), v=_t.encode(va, wire, "v"),
            mask=mask,
            q_lengths=_lengths(q_lengths, "q_lengths"),
            kv_lengths=_lengths(kv_lengths, "kv_lengths"),
            backend=backend or "", return_lse=bool(return_lse))
        if scale is not None:
            req.scale = float(scale)
        if fp8 is not None:
            req.fp8.CopyFrom(_fp8_options(fp8))
        return req

    def attend(self, q, k, v, *, causal=None, window=None, q_lengths=None, kv_lengths=None,
               scale=None, backend=None, return_lse=False, varlen=None, dtype=None,
               fp8=None, timeout=None):
        """O = softmax(scale · Q Kᵀ + mask) V on the server.

        Shapes (JAX layout): padded q (B,T,N,H), k and v (B,S,K,H); varlen (packed)
        q (total_q,N,H), k and v (total_kv,K,H) with q_lengths/kv_lengths (B) required and
        summing to the totals. N % K == 0 (GQA/MQA when K < N). `varlen` defaults to the rank
        that two of q, k, v have (3: varlen); an argument of another rank is named in the error.
        Inputs: numpy arrays or torch tensors. dtype on the wire: `dtype` ("float32",
        "float16", "bfloat16") if given, else q's: float32 → FLOAT32, float16 → FLOAT16,
        bfloat16 (torch or ml_dtypes) → BFLOAT16, float64 → FLOAT32. k and v are converted to
        the same wire dtype. bf16 from float32 rounds to nearest even.
        causal: None (no causal mask), "top_left" (keep j <= i) or "bottom_right"
        (keep j <= i + S_b - T_b). window: (left, right) band around the diagonal, each an int
        >= 0 or None (unbounded). q_lengths / kv_lengths: per-entry valid lengths (padding
        beyond them is never read; an entry with 0 keys gives zero rows and lse -inf).
        scale: softmax scale (default 1/sqrt(H)). backend: "auto", "cpu", "naive", "fused"...
        (None: server default; a named backend that cannot run the input raises
        FailedPrecondition). return_lse: also return the float32 log-sum-exp (natural log).
        fp8: backend "fp8" only (docs/fp8.md), an attention.v1.Fp8Options or a dict of any of
        rotate (bool), smooth_k (bool),
        qk_format ("e4m3_per_tensor" or "int8_per_token") and pv_format ("e4m3" or "16bit");
        unset keys take the server's defaults (measures on, the device's formats); the recipe
        that ran is report.recipe. timeout: seconds (None: the client's default).

        Returns AttendResult(o, lse, report). Raises InvalidArgument (bad shapes, dtypes,
        lengths, unknown backend; the server's message names the field; a head-count error
        for arrays that fit PyTorch's (B,N,T,H) also names the expected layout and torch_sdpa
        in attention_client.ecosystems), FailedPrecondition, ResourceExhausted,
        DeadlineExceeded, Unavailable, Internal (AttentionError subclasses).
        """
        req = self.build_request(q, k, v, causal=causal, window=window, q_lengths=q_lengths,
                                 kv_lengths=kv_lengths, scale=scale, backend=backend,
                                 return_lse=return_lse, varlen=varlen, dtype=dtype, fp8=fp8)
        try:
            resp = self._call(self._attn.Attend, "Attend", req, timeout)
        except InvalidArgument as e:  # (B,N,T,H) arrays: the message names the layout
            raise layout_hint(e, req) from None
        return self._attend_result(resp, q, return_lse)

    @staticmethod
    def _attend_result(resp, q, return_lse):
        o = _t.decode(resp.o)
        if _t._is_torch(q):
            o = _t.to_torch(o, q)
        lse = _t.decode(resp.lse) if return_lse and resp.HasField("lse") else None
        return AttendResult(o=o, lse=lse, report=Report.from_pb(resp.report))

    # -- sequences --------------------------------------------------------------------------
    def create_sequence(self, num_layers, num_heads, num_kv_heads, head_dim, *,
                        dtype="float32", kv_cache_dtype=None, reserve_tokens=0, scale=None,
                        k_scales=None, v_scales=None, timeout=None):
        """CreateSequence → :class:`Sequence` (a handle; use as a context manager to release).

        num_layers >= 1; num_heads N, num_kv_heads K (N % K == 0); head_dim H (<= 1024).
        dtype: q/k/v/o dtype of Extend ("float32", "float16", "bfloat16"). kv_cache_dtype:
        None (= dtype), dtype, or "float8_e4m3" (with optional k_scales/v_scales, layer-major
        (num_layers, num_kv_heads)). reserve_tokens: tokens per layer to reserve now.
        scale: softmax scale (default 1/sqrt(H)). Raises InvalidArgument, ResourceExhausted.
        """
        req = self._create_request(num_layers, num_heads, num_kv_heads, head_dim, dtype,
                                   kv_cache_dtype, reserve_tokens, scale, k_scales, v_scales)
        resp = self._call(self._seq.CreateSequence, "CreateSequence", req, timeout)
        return Sequence(self, resp.sequence)

    @staticmethod
    def _create_request(num_layers, num_heads, num_kv_heads, head_dim, dtype, kv_cache_dtype,
                        reserve_tokens, scale, k_scales, v_scales):
        kvd = pb.DTYPE_UNSPECIFIED
        if kv_cache_dtype is not None:
            s = str(kv_cache_dtype).lower()
            kvd = pb.FLOAT8_E4M3 if s in ("float8_e4m3", "fp8", "e4m3", "float8_e4m3fn") \
                else _t.wire_dtype(kv_cache_dtype)
        req = spb.CreateSequenceRequest(
            num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, dtype=_t.wire_dtype(dtype), kv_cache_dtype=kvd,
            reserve_tokens=reserve_tokens,
            k_scales=[float(x) for x in np.asarray(k_scales if k_scales is not None else [],
                                                   dtype=np.float64).reshape(-1)],
            v_scales=[float(x) for x in np.asarray(v_scales if v_scales is not None else [],
                                                   dtype=np.float64).reshape(-1)])
        if scale is not None:
            req.scale = float(scale)
        return req

    def sequence(self, sequence_id, *, timeout=None):
        """A handle on an existing sequence (GetSequence; NotFound if unknown or foreign)."""
        info = self._call(self._seq.GetSequence, "GetSequence",
                          spb.GetSequenceRequest(sequence_id=sequence_id), timeout).sequence
        return Sequence(self, info)

    @staticmethod
    def _extend_result(resp, q, o=None):
        if o is None:
            o = _t.decode(resp.o)
            if _t._is_torch(q):
                o = _t.to_torch(o, q)
        return ExtendResult(o=o, length=int(resp.length), replayed=bool(resp.replayed),
                            report=Report.from_pb(resp.report))

    def extend_batch(self, steps, *, timeout=None, fast=None, timings=None):
        """ExtendBatch: one layer's step for many sequences.

        steps: iterable of (sequence, layer, position, q, k, v) (position None: the handle's
        known length); q (T,N,H), k and v (T,K,H). Returns a list, in order, of ExtendResult or
        the AttentionError instance for a step that failed (the call itself raises only for
        request-level problems).
        fast: None (default): the fast path (attention_client.fastpath: bytes as they are, one
        device→host and one host→device copy for CUDA tensors) when every q/k/v is a torch
        tensor (one device) or numpy array already of the sequences' dtype, else the old path
        (converted through numpy/float32). True: the fast path or InvalidArgument saying why
        not. False: the old path. Both give the same values; the fast path's o of all steps
        are views of one tensor/array in q's dtype on q's device. The fast path goes through
        attention_client.wire (request bytes built with one copy of the tensor bytes, o copied
        once from the reply) unless client.wire is False (protobuf messages).
        timings: None, or a dict to which the call adds the µs of its phases (gather_us,
        encode_us, rpc_us, decode_us, scatter_us; see attention_client.extend_calls)."""
        steps = list(steps)
        tm = Phases(timings)
        p = self._plan(steps, fast)
        req = self._batch_request(steps, p, tm)
        resp = self._call(self._unary("ExtendBatch", p), "ExtendBatch", req, timeout)
        tm.lap("rpc_us")
        return self._batch_results(steps, resp, p, "ExtendBatch", tm)

    def extend_stream(self, *, timeout=None, max_in_flight=3):
        """Opens an ExtendStream: → :class:`attention_client.stream.ExtendStream` (submit steps,
        up to max_in_flight of them unanswered at a time; replies matched to steps in order).
        timeout: deadline of the whole stream in seconds (None: the client's default)."""
        from .stream import ExtendStream
        return ExtendStream(self, timeout=self.timeout if timeout is None else timeout,
                            max_in_flight=max_in_flight)

    def batch_stream(self, *, timeout=None, max_in_flight=2):
        """Opens an ExtendBatchStream: → :class:`attention_client.batch_stream.BatchStream`
        (packed batches submitted with tags, up to max_in_flight unanswered, replies matched
        by tag). timeout: deadline of the whole stream in seconds (None: the client's)."""
        from .batch_stream import BatchStream
        return BatchStream(self, timeout=self.timeout if timeout is None else timeout,
                           max_in_flight=max_in_flight)

    def shared_region(self, nbytes, *, timeout=30.0):
        """A host shared-memory region of nbytes leased to the server: →
        :class:`attention_client.shared_memory.SharedRegion` (name it in extend_packed(...,
        region=) or BatchStream.submit(..., region=); close() ends the lease and unlinks)."""
        from .shared_memory import SharedRegion
        return SharedRegion(self, nbytes, timeout=timeout)

    def cuda_region(self, nbytes=None, *, tensor=None, device=None, timeout=30.0):
        """A region of this process's GPU memory leased to a server on the same GPU (CUDA
        IPC): → :class:`attention_client.cuda_region.CudaRegion` (nbytes: a new buffer on
        device, or tensor: a contiguous CUDA tensor's bytes; name it in extend_packed(...,
        region=) or BatchStream.submit(..., region=) with torch CUDA tensors; close() ends the
        lease once the server closed its mapping). Needs torch with CUDA and libcuda."""
        from .cuda_region import CudaRegion
        return CudaRegion(self, nbytes, tensor=tensor, device=device, timeout=timeout)

    def _metadata(self, identity=None):
        """gRPC metadata of every call: identity (this call's or the client's) and token."""
        ident = self.identity if identity is None else identity
        md = []
        if ident is not None:
            md.append(("x-attn-identity", ident))
        if self._token is not None:
            md.append(("authorization", "Bearer " + self._token))
        return tuple(md) or None

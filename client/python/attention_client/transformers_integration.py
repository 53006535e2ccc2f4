"""Run an unmodified Hugging Face transformers causal LM with its attention on attention-server.

    from attention_client import AttentionClient
    from attention_client.transformers_integration import attach

    with AttentionClient("127.0.0.1:50051") as client, attach(model, client) as session:
        out = model.generate(**batch, max_new_tokens=32)       # greedy or sampling

``attach`` registers the attention function ``"attention_server"`` in transformers'
``AttentionInterface`` (importing this module does it too, so ``from_pretrained(...,
attn_implementation="attention_server")`` works) and switches the model to it. While
attached, each forward pass of the model:
  - holds no KV cache of its own: a :class:`~attention_client.transformers_cache.ServerCache`
    takes the model cache's place and stores nothing; the server's sequences hold the K/V;
  - sends one packed ExtendBatch per layer carrying every row of the batch in one q, one k
    and one v tensor (one server sequence per row, created at the conversation's first
    forward, released when ``generate`` returns, at the next conversation, or at detach);
  - with ``attach(..., transport_region="cuda")`` (or ``"auto"``, when the server is on the
    model's GPU), sends q/k/v and gets o through one CUDA IPC region leased from the model's
    GPU memory (:mod:`~attention_client.region_transport`): the messages carry slices only
    and nothing crosses the host; outputs and errors are those of the bytes path;
  - sends only the real tokens of each row: tokens whose 2-D ``attention_mask`` is 0 (left
    padding) never enter the server's sequence, so a padded row attends exactly as it would
    alone; Extend positions are the session's per-row lengths;
  - when the server lost a row's sequence (NOT_FOUND: evicted, expired, replica restarted),
    rolls the step back (rows that appended are truncated), re-creates that sequence,
    re-prefills it from the row's recorded token ids and runs the step again
    (``recovery="reprefill"``, default), or raises :class:`~attention_client.session.
    SequenceLost` (``recovery="raise"``).
Refused with :class:`UnsupportedModel` (before anything is sent): attention the server's
sequences cannot express: sliding windows (Mistral with ``sliding_window`` set, Gemma 2/3,
gpt-oss, Qwen2 with ``use_sliding_window``), attention logit soft-capping (Gemma 2), attention
sinks (gpt-oss), chunked attention (Llama 4), non-causal or cross-attention, dropout (training),
4-D custom masks; models whose attention does not dispatch through ``AttentionInterface``.
Not supported (clear errors): beam search, assisted/contrastive decoding, ``inputs_embeds``
rows under ``recovery="reprefill"`` once a sequence is lost.
"""
import contextlib
import functools
import inspect
import threading

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache

from .errors import AttentionError
from .session import RowsLost, SequenceLost, ServerSession
from .transformers_cache import ServerCache

IMPLEMENTATION = "attention_server"
_ACTIVE = threading.local()


class UnsupportedModel(ValueError):
    """The model's attention needs something the server's sequences do not have (the message
    says what and where)."""


def _active():
    stack = getattr(_ACTIVE, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def _activated(ms):
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(ms)
    try:
        yield
    finally:
        stack.pop()


@torch.compiler.disable
def attention_server_forward(module, query, key, value, attention_mask, scaling=None,
                             dropout=0.0, **kwargs):
    """The "attention_server" AttentionInterface function: query (B, N, T, H), key/value
    (B, K, T, H) of this step's tokens → (attn_output (B, T, N, H), None). Works only inside a
    forward pass of a model attached with :func:`attach`; raises RuntimeError otherwise.

    Opaque to torch.compile (``torch.compiler.disable``): a compiled model (e.g.
    ``model.forward = torch.compile(model.forward, mode="reduce-overhead")`` after attach)
    breaks its graph at each attention call, which runs eagerly (the session's Python state,
    the RPC), and runs everything between the calls compiled (inductor kernels; with
    mode="reduce-overhead" on CUDA, one CUDA graph per piece)."""
    ms = _active()
    if ms is None:
        raise RuntimeError(
            'attn_implementation="attention_server" runs only on a model attached to a server: '
            "use attention_client.transformers_integration.attach(model, client)")
    return ms.attend(module, query, key, value, scaling, dropout, kwargs), None


def _no_mask(*args, **kwargs):
    """Mask function for "attention_server": no mask is built (the session sends only real
    tokens and the server applies the causal mask)."""
    return None


def register():
    """Registers "attention_server" in transformers' AttentionInterface and its (empty) mask
    function in AttentionMaskInterface. Idempotent; done on import of this module."""
    AttentionInterface.register(IMPLEMENTATION, attention_server_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
        AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)
    except ImportError:  # pragma: no cover - transformers without mask interfaces
        pass


register()


def unsupported_reasons(model):
    """What in `model` the server's sequences cannot run: a list of strings (empty: fine)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    why = []
    kinds = set(getattr(cfg, "layer_types", None) or [])
    if kinds - {"full_attention"}:
        why.append(f"layer_types {sorted(kinds - {'full_attention'})} (only full causal "
                   "attention is served)")
    elif getattr(cfg, "sliding_window", None) is not None and \
            getattr(cfg, "use_sliding_window", True) is not False:
        why.append(f"sliding_window={cfg.sliding_window} (the server's sequences attend over "
                   "the whole context; set config.sliding_window=None only if contexts never "
                   "exceed it)")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        why.append(f"attn_logit_softcapping={cfg.attn_logit_softcapping} (logit soft-capping)")
    if getattr(cfg, "attention_chunk_size", None) is not None:
        why.append(f"attention_chunk_size={cfg.attention_chunk_size} (chunked attention)")
    if getattr(model.config, "is_encoder_decoder", False):
        why.append("encoder-decoder model (cross-attention)")
    for name, m in model.named_modules():
        if not hasattr(m, "layer_idx") or not hasattr(m, "scaling"):
            continue
        if getattr(m, "sliding_window", None) is not None:
            why.append(f"{name}: sliding_window={m.sliding_window}")
        if getattr(m, "attn_logit_softcapping", None) is not None:
            why.append(f"{name}: attn_logit_softcapping={m.attn_logit_softcapping}")
        if getattr(m, "sinks", None) is not None:
            why.append(f"{name}: attention sinks (learned per-head sink logits)")
        if getattr(m, "is_causal", True) is False:
            why.append(f"{name}: non-causal attention")
    return why


def check_supported(model):
    """Raises UnsupportedModel naming every reason the model cannot run on the server."""
    why = unsupported_reasons(model)
    if why:
        raise UnsupportedModel(
            f"{type(model).__name__} cannot run its attention on attention-server: "
            + "; ".join(why[:8]) + (f"; and {len(why) - 8} more" if len(why) > 8 else ""))


class AttachedModel:
    """A model attached to a server (returned by :func:`attach`; a context manager that
    detaches). Attributes: model, session (:class:`~attention_client.session.ServerSession`:
    sequence ids, stats, per-call timings in session.calls). Methods: detach().
    One conversation at a time: not for concurrent forward/generate calls on the same model
    from several threads (attach one model copy per thread)."""

    def __init__(self, model, session, *, release_after_generate=True):
        self.model = model
        self.session = session
        self.release_after_generate = release_after_generate
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
            else model.config
        self._num_layers = int(cfg.num_hidden_layers)
        self._use_cache_default = getattr(cfg, "use_cache", True)
        self._orig_forward = model.forward
        self._orig_generate = getattr(model, "generate", None)
        self._sig = inspect.signature(self._orig_forward)
        params = self._sig.parameters
        self._varkw = next((p.name for p in params.values()
                            if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        self._cache_name = "cache" if "cache" in params else "past_key_values"
        base = getattr(model, "base_model", model)
        self._prefill_model = base if base is not model else None
        self._prev_impl = model.config._attn_implementation
        self._attached = True

        @functools.wraps(self._orig_forward)
        def forward(*args, **kwargs):
            return self._forward(*args, **kwargs)
        model.forward = forward
        if self._orig_generate is not None:
            @functools.wraps(self._orig_generate)
            def generate(*args, **kwargs):
                return self._generate(*args, **kwargs)
            model.generate = generate

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()

    def detach(self):
        """Restores the model's forward, generate and attention implementation, releases the
        sequences and ends the CUDA IPC region's lease (transport_region). Idempotent."""
        if not self._attached:
            return
        self._attached = False
        for name in ("forward", "generate"):
            self.model.__dict__.pop(name, None)
        try:
            self.model.set_attn_implementation(self._prev_impl)
        finally:
            self.session.close()

    # -- model hooks -----------------------------------------------------------------------
    def _generate(self, *args, **kwargs):
        # generate would torch.compile the forward pass (gRPC calls inside) when its config
        # asks for a compilable cache: the server path never compiles
        if hasattr(self.model.generation_config, "disable_compile"):
            kwargs.setdefault("disable_compile", True)
        try:
            return self._orig_generate(*args, **kwargs)
        finally:
            if self.release_after_generate:
                self.session.release()

    def _forward(self, *args, **kwargs):
        ba = self._sig.bind(*args, **kwargs)
        kw = dict(ba.arguments)
        kw.update(kw.pop(self._varkw, None) or {})
        x = kw.get("input_ids")
        x = kw.get("inputs_embeds") if x is None else x
        if x is None:
            raise ValueError("attention_server: give input_ids or inputs_embeds")
        B, T = int(x.shape[0]), int(x.shape[1])
        caches = [kw.pop(n) for n in ("cache", "past_key_values") if n in kw]
        cache = next((c for c in caches if c is not None), None)
        use_cache = kw.get("use_cache")
        use_cache = self._use_cache_default if use_cache is None else bool(use_cache)
        s = self.session
        if isinstance(cache, ServerCache) and cache.owner is self:
            if cache.generation != s.generation or not s.rows:
                raise SequenceLost(
                    "this cache's server sequences were released (generate returned, a new "
                    "conversation began, or the model was detached); attach with "
                    "release_after_generate=False to continue a conversation", rows=[])
            if B != len(s.rows):
                raise ValueError(f"attention_server: batch of {B} rows continues a "
                                 f"conversation of {len(s.rows)} rows")
            past = cache.seen
        elif cache is None or (isinstance(cache, Cache) and cache.get_seq_length() == 0):
            s.begin(B, self._num_layers)
            past = 0
            cache = ServerCache(self, s.generation, self._num_layers) if use_cache else None
        else:
            raise ValueError(
                f"attention_server: this forward pass carries a model-side KV cache "
                f"({type(cache).__name__}) holding tokens; the server holds the cache: start "
                "without one (or with an empty one)")
        kw[self._cache_name] = cache
        select, real = self._select(kw.get("attention_mask"), B, T, past)
        ids = kw.get("input_ids")
        pos = kw.get("position_ids")
        if pos is None:
            pos = torch.arange(past, past + T).unsqueeze(0)
        out = self._run_step(kw, select)
        if cache is not None:
            cache.seen += T
        if use_cache:
            s.commit_step(*self._step_tokens(ids, pos, real, B, T))
        else:
            s.release()
        return out

    @staticmethod
    def _select(mask, B, T, past):
        """2-D padding mask → (select for LayerCalls or None, per-row bool tensor of real
        tokens among the T new ones, or None when all are real)."""
        if mask is None:
            return None, None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise UnsupportedModel("attention_server takes a 2-D padding attention_mask "
                                   "(batch, tokens so far); a 4-D or custom mask cannot be "
                                   "expressed on server sequences")
        if mask.shape[1] != past + T:
            raise ValueError(f"attention_mask has {mask.shape[1]} columns; expected "
                             f"{past + T} (tokens already seen {past} + new {T})")
        real = mask[:, mask.shape[1] - T:].to(device="cpu", dtype=torch.bool)
        if bool(real.all()):
            return None, None
        return [torch.nonzero(real[b]).flatten().tolist() for b in range(B)], real

    @staticmethod
    def _step_tokens(ids, pos, real, B, T):
        """Per row (token ids, positions) of the step's real tokens, on the CPU; (None, None)
        when the step came as embeddings."""
        if ids is None:
            return None, None
        ids = ids.detach().to("cpu")
        pos = pos.detach().to("cpu")
        if pos.dim() != 2:  # e.g. multimodal rope (3, B, T): no re-prefill from ids alone
            return None, None
        pos = pos.expand(B, T)
        if real is None:
            return [ids[b] for b in range(B)], [pos[b] for b in range(B)]
        return [ids[b][real[b]] for b in range(B)], [pos[b][real[b]] for b in range(B)]

    def _run_step(self, kw, select):
        s = self.session
        for attempt in range(s.max_recoveries + 1):
            s.start_step(select)
            try:
                with _activated(self):
                    out = self._orig_forward(**kw)
            except RowsLost as e:
                gone = sorted(set(e.rows) | set(s.rollback_step()))
                details = "; ".join(f"row {b}: {err.details}" for b, err in e.rows.items())
                if s.recovery == "raise":
                    raise SequenceLost(f"server sequence lost ({details}); recovery='raise'",
                                       gone, next(iter(e.rows.values()))) from None
                if attempt == s.max_recoveries:
                    raise SequenceLost(f"server sequence lost again after {attempt} "
                                       f"recoveries ({details})", gone,
                                       next(iter(e.rows.values()))) from None
                for b in gone:
                    self._rebuild(b)
                continue
            except BaseException:
                with contextlib.suppress(AttentionError):
                    s.rollback_step()
                raise
            if s.layer_calls_this_step == 0:
                raise RuntimeError(
                    "the forward pass made no attention-server call: the model's attention "
                    "does not go through AttentionInterface (no silent local fallback)")
            return out

    def _rebuild(self, row):
        """Re-create row's sequence and re-prefill it from the row's committed tokens."""
        s = self.session
        s.recreate(row)
        if not s.rows[row].replayable:
            raise SequenceLost(f"row {row}: its sequence was lost and cannot be re-prefilled "
                               "(the conversation was fed inputs_embeds)", [row])
        toks, poss = s.history(row)
        if not toks:
            return
        dev = next(self.model.parameters()).device
        ids = torch.cat(toks).unsqueeze(0).to(dev)
        pos = torch.cat(poss).unsqueeze(0).to(dev)
        target = self._prefill_model or self._orig_forward
        s.start_step(None, route=[row])
        try:
            with _activated(self), torch.no_grad():
                target(input_ids=ids, position_ids=pos, use_cache=False)
        except RowsLost as e:
            raise SequenceLost(f"row {row}: sequence lost again while re-prefilling",
                               [row], next(iter(e.rows.values()))) from None
        finally:
            s.route = None

    def attend(self, module, query, key, value, scaling, dropout, kwargs):
        """One layer's attention for the active forward pass (see attention_server_forward)."""
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise UnsupportedModel(f"{type(module).__name__} has no layer_idx")
        for name, what in (("sliding_window", "a sliding window"),
                           ("softcap", "logit soft-capping"), ("s_aux", "attention sinks")):
            if kwargs.get(name) is not None:
                raise UnsupportedModel(f"layer {layer} asks for {what} ({name}), which the "
                                       "server's sequences do not have")
        if dropout:
            raise UnsupportedModel(f"attention dropout {dropout} (training mode): the server "
                                   "path is inference only; call model.eval()")
        if key.shape[-2] != query.shape[-2]:
            raise ValueError(
                f"layer {layer}: {key.shape[-2]} keys for {query.shape[-2]} queries; the "
                "attention server expects only the step's new tokens (is a model-side KV "
                "cache active?)")
        o = self.session.extend(layer, query.transpose(1, 2), key.transpose(1, 2),
                                value.transpose(1, 2), scaling)
        return o


def attach(model, client, *, recovery="reprefill", kv_cache_dtype=None, reserve_tokens=0,
           timeout=None, release_after_generate=True, max_recoveries=3,
           max_call_bytes=128 << 20, transport_region=None):
    """Run `model` (a transformers causal LM, eval mode) with its attention on the server.

    client: attention_client.AttentionClient. recovery: "reprefill" (default) or "raise" when
    a sequence is lost (see the module docstring). kv_cache_dtype: page dtype of the sequences
    (None: the model's dtype; "float8_e4m3"). reserve_tokens: tokens per layer reserved per
    sequence at creation. timeout: per-call deadline (seconds; None: the client's).
    release_after_generate: release the sequences when generate returns (False: keep them, so
    the returned cache can continue the conversation; they go at the next conversation or at
    detach). max_recoveries: rebuild attempts per step. max_call_bytes: q+k+v bytes above
    which one layer's step (a big prefill) is split into several ExtendBatch calls along the
    tokens; keep it under the server's --max-message-bytes.
    transport_region: how q/k/v (B, T, heads, H) and o (B, T, N, H), the model's dtype, travel:
      None (default): as bytes in the messages (one device→host copy of q/k/v, one
        host→device copy of o per call);
      "cuda": through one CUDA IPC region (CudaRegion) of the model's GPU, leased at the first
        layer call, re-leased larger when a call does not fit (the old lease closed first),
        kept across generate calls and closed at detach. Needs the model on the server's GPU
        (GetServerInfo.device_uuid), a server whose GetServerInfo.cuda_ipc_regions is true,
        torch with CUDA and libcuda, and both processes allowed to share device memory
        (README "CUDA IPC regions"); else FailedPrecondition here (checked with one
        GetServerInfo) or the lease's error at the first layer call;
      "auto": "cuda" when those hold and the lease succeeds, else bytes, saying so with a
        RuntimeWarning (once per reason) and session.stats.transport_fallback.
      Either way a layer's first step of an FP8 sequence goes as bytes (its scales come from
      those k/v); session.stats counts region_calls, byte_calls and region_leases.
    Returns an :class:`AttachedModel` (context manager: detaches on exit).
    Raises UnsupportedModel when the model's attention cannot run on the server; ValueError
    for an unknown transport_region; FailedPrecondition (transport_region="cuda", see above)
    and GetServerInfo's errors (a transport_region given) before the model is changed.
    """
    check_supported(model)
    if getattr(model, "training", False):
        raise UnsupportedModel("the model is in training mode: call model.eval() first")
    session = ServerSession(client, recovery=recovery, kv_cache_dtype=kv_cache_dtype,
                            reserve_tokens=reserve_tokens, timeout=timeout,
                            max_recoveries=max_recoveries, max_call_bytes=max_call_bytes,
                            transport_region=transport_region)
    param = next(model.parameters(), None)
    if param is not None:
        session.check_transport(param.device)
    prev = model.config._attn_implementation
    if prev != IMPLEMENTATION:
        model.set_attn_implementation(IMPLEMENTATION)
    if model.config._attn_implementation != IMPLEMENTATION:
        raise UnsupportedModel(f"{type(model).__name__} does not dispatch its attention through "
                               "AttentionInterface (set_attn_implementation had no effect)")
    am = AttachedModel(model, session, release_after_generate=release_after_generate)
    am._prev_impl = prev
    return am

"""Sequence: a handle on a server-side sequence (paged KV cache), from
AttentionClient.create_sequence / AttentionClient.sequence."""
from ._pb import sequence_pb2 as spb
from .errors import NotFound


class Sequence:
    """A server-side sequence (paged KV cache) owned by the client's identity.

    Attributes: id (32 hex digits), info (last SequenceInfo seen), layer_lengths (tokens per
    layer as known to this handle). Context manager: release() on exit (NotFound ignored).
    """

    def __init__(self, client, info):
        self._client = client
        self.info = info
        self.id = info.sequence_id
        self._lengths = list(info.layer_lengths) or [0] * info.num_layers

    @property
    def layer_lengths(self):
        return list(self._lengths)

    def __repr__(self):
        return f"Sequence({self.id}, lengths={self._lengths})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.release()
        except NotFound:
            pass

    def _update(self, info):
        self.info = info
        self._lengths = list(info.layer_lengths)
        return info

    def extend(self, layer, position, q, k, v, *, timeout=None, fast=None):
        """Append k/v (T,K,H) at `position` of `layer` and attend q (T,N,H) over the whole
        cache (bottom-right causal: row i sees keys j <= position + i).

        position must equal the layer's current length (None: this handle's known length),
        else FailedPrecondition (message gives the length). Arrays are converted to the
        sequence's dtype. Returns ExtendResult(o (T,N,H), length, replayed, report).
        fast: as in AttentionClient.extend_batch."""
        c = self._client
        step = (self, layer, position, q, k, v)
        p = c._plan([step], fast)
        resp = c._call(c._unary("Extend", p), "Extend", c._step_request(step, p), timeout)
        return c._extend_response(step, resp, p)

    def refresh(self, *, timeout=None):
        """GetSequence → SequenceInfo (also updates this handle)."""
        return self._update(self._client._call(
            self._client._seq.GetSequence, "GetSequence",
            spb.GetSequenceRequest(sequence_id=self.id), timeout).sequence)

    def truncate(self, length, *, timeout=None):
        """Cut every layer longer than `length` (>= 0) back to it → SequenceInfo."""
        return self._update(self._client._call(
            self._client._seq.TruncateSequence, "TruncateSequence",
            spb.TruncateSequenceRequest(sequence_id=self.id, length=int(length)),
            timeout).sequence)

    def fork(self, length=None, *, timeout=None):
        """ForkSequence (copy-on-write; optionally only the first `length` tokens) → the
        child Sequence."""
        req = spb.ForkSequenceRequest(sequence_id=self.id)
        if length is not None:
            req.length = int(length)
        info = self._client._call(self._client._seq.ForkSequence, "ForkSequence", req,
                                  timeout).sequence
        return Sequence(self._client, info)

    def release(self, *, timeout=None):
        """ReleaseSequence → pages freed (pages still shared with forks stay)."""
        return int(self._client._call(
            self._client._seq.ReleaseSequence, "ReleaseSequence",
            spb.ReleaseSequenceRequest(sequence_id=self.id), timeout).pages_freed)

"""A transformers ``Cache`` that keeps nothing: the attention server holds the K/V.

:class:`ServerCache` stands in for the model's own KV cache while a model runs with
``attn_implementation="attention_server"`` (transformers_integration.py puts it in place). Its
layers hand each step's new key/value states straight through to the attention function (which
sends them to the server) and store nothing on the device; it only counts the tokens the model
has seen (padding included: the model's own coordinates), so that ``generate`` slices its inputs
and sizes its masks as with a real cache. Beam search, cache cropping (assisted decoding) and
batch reordering need server-side forks or truncation per row and are refused with a clear
error.
"""
from transformers.cache_utils import Cache, DynamicLayer

_UNSUPPORTED = ("the attention-server cache does not support {what} (beam search, assisted or "
                "contrastive decoding): use greedy or sampling generation")


class _ServerCacheLayer(DynamicLayer):
    """One layer: passes key/value states through, stores nothing, length from the owner."""

    is_sliding = False
    is_croppable = False

    def __init__(self, owner):
        super().__init__()
        self._owner = owner
        # Initialised from the start (it holds nothing to size): no first-call branch in update,
        # so a compiled model does not compile each layer's frame once more for that branch.
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states, *args, **kwargs):
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Returns the new states unchanged (the attention function sends them)."""
        return key_states, value_states

    def get_seq_length(self, *args, **kwargs):
        return self._owner.seen

    def get_mask_sizes(self, query_length, *args, **kwargs):
        # query_length is an int (transformers >= 5.2x) or the cache_position tensor (older)
        n = query_length if isinstance(query_length, int) else int(query_length.shape[0])
        return self._owner.seen + n, 0

    def get_max_length(self):
        return -1

    def reset(self):
        raise NotImplementedError(_UNSUPPORTED.format(what="reset"))

    def crop(self, tokens_to_remove):
        raise NotImplementedError(_UNSUPPORTED.format(what="crop"))

    def reorder_cache(self, beam_idx):
        raise NotImplementedError(_UNSUPPORTED.format(what="reorder_cache"))

    def batch_repeat_interleave(self, repeats):
        raise NotImplementedError(_UNSUPPORTED.format(what="batch_repeat_interleave"))

    def batch_select_indices(self, indices):
        raise NotImplementedError(_UNSUPPORTED.format(what="batch_select_indices"))

    def offload(self):
        pass

    def prefetch(self):
        pass


class ServerCache(Cache):
    """The model-side stand-in for the server's sequences of one conversation.

    ServerCache(owner, generation, num_layers): owner is the attached model session,
    generation the session's conversation number this cache belongs to (a cache from an
    earlier conversation is refused). seen: tokens (padded coordinates) the model has
    processed; advanced by the owner after each successful forward pass.
    """

    def __init__(self, owner, generation, num_layers):
        super().__init__(layers=[_ServerCacheLayer(self) for _ in range(int(num_layers))])
        self.owner = owner
        self.generation = generation
        self.seen = 0

    def update(self, key_states, value_states, layer_idx=None, *args, **kwargs):
        """Returns the new states unchanged, whatever the layer (nothing is stored). Not
        indexing the layers by layer_idx keeps a compiled model's attention frames free of
        per-layer guards: all layers share one compiled graph per input shape."""
        return key_states, value_states

    def get_seq_length(self, layer_idx=0, *args, **kwargs):
        return self.seen

    @property
    def is_compileable(self):
        return False

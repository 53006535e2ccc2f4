"""attention_client: Python client for attention-server (attention.v1 over gRPC).

    from attention_client import AttentionClient
    with AttentionClient("127.0.0.1:50051") as c:   # or "unix:/run/attn/attn.sock"
        r = c.attend(q, k, v, causal="bottom_right", kv_lengths=[5, 7])
        r.o, r.lse, r.report

See client/python/README.md.
"""
from . import errors
from .client import AttendResult, AttentionClient, ExtendResult, Report
from .sequence import Sequence
from .stream import ExtendStream
from .batch_stream import BatchStream
from .packed_calls import PackedResult, StepResult
from .shared_memory import SharedRegion
from .cuda_region import CudaRegion
from .aio import AsyncAttentionClient, AsyncExtendStream, AsyncSequence
from .aio_batch_stream import AsyncBatchStream
from .replicas import ReplicaSet
from .ecosystems import jax_dot_product_attention, torch_sdpa
from .errors import (Aborted, AlreadyExists, AttentionError, Cancelled, DataLoss,
                     DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound,
                     OutOfRange, PermissionDenied, ResourceExhausted, Unauthenticated,
                     Unavailable, Unimplemented, Unknown)
from .tensors import bf16_bits_to_float32, float32_to_bf16_bits, round_to_bf16

__version__ = "0.1.0"

__all__ = [
    "AttentionClient", "AttendResult", "ExtendResult", "Report", "ReplicaSet", "Sequence",
    "ExtendStream", "BatchStream", "PackedResult", "StepResult", "SharedRegion",
    "CudaRegion",
    "AsyncAttentionClient", "AsyncBatchStream", "AsyncSequence", "AsyncExtendStream",
    "torch_sdpa", "jax_dot_product_attention",
    "errors",
    "AttentionError", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented",
    "Unknown", "bf16_bits_to_float32", "float32_to_bf16_bits", "round_to_bf16",
]

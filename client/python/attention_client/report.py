"""Report: what ran on the server and how long it took (its ExecutionReport), as every result
of the client carries it (AttendResult, ExtendResult, PackedResult)."""
import dataclasses

_PHASES = ("decode_us", "queue_us", "host_to_device_us", "kernel_us", "device_to_host_us",
           "encode_us", "total_us")


@dataclasses.dataclass
class Report:
    """What ran and how long it took (the server's ExecutionReport). Times in microseconds."""
    backend: str
    backend_reason: str
    batch_size: int
    batch_tokens: int
    flops: float
    device: str
    times_us: dict  # phase name (decode, queue, host_to_device, kernel, device_to_host,
                    # encode, total) → µs
    # False when the server ran the step without device timing (GPU KV cache, a CUDA graph
    # replayed without its event nodes: --kv-timing-every): host_to_device, kernel and
    # device_to_host are then 0, "not measured". True for every Attend.
    device_timed: bool = True
    # Backend "fp8": the quantisation recipe that ran (ExecutionReport.recipe); "" elsewhere.
    recipe: str = ""

    @classmethod
    def from_pb(cls, r):
        t = r.times  # keys: _PHASES less "_us", spelled out (cheaper than a getattr loop)
        return cls(backend=r.backend, backend_reason=r.backend_reason, batch_size=r.batch_size,
                   batch_tokens=r.batch_tokens, flops=r.flops, device=r.device,
                   times_us={"decode": t.decode_us, "queue": t.queue_us,
                             "host_to_device": t.host_to_device_us, "kernel": t.kernel_us,
                             "device_to_host": t.device_to_host_us, "encode": t.encode_us,
                             "total": t.total_us},
                   device_timed=not t.device_untimed, recipe=r.recipe)

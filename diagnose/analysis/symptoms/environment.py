"""What the script set up, as the run record shows it: CPUs, backend flags, the model's wrappers."""

from __future__ import annotations

from typing import Any

from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


@symptom("cpu.count", "count", "CPUs this process may use")
def cpu_count(record: RunRecord) -> int | None:
    return record.environment.get("cpu_count") or None


@symptom("cpu.cores", "count", "physical cores among the CPUs this process may use (a core's hyperthreads count once)")
def cpu_cores(record: RunRecord) -> int | None:
    return record.environment.get("cpu_cores") or None


@symptom(
    "host.loader_receive_ms_per_mb",
    "ms",
    "what the main process spends per MB of a batch that a DataLoader worker hands it through shared memory "
    "(map, fault in, copy to pinned memory, free), measured once at the run's end",
)
def loader_receive_ms_per_mb(record: RunRecord) -> float | None:
    return record.environment.get("loader_receive_ms_per_mb") or None


@symptom("cudnn.benchmark", "bool", "torch.backends.cudnn.benchmark")
def cudnn_benchmark(record: RunRecord) -> bool | None:
    return record.flags.get("cudnn_benchmark", False) if record.flags else None


@symptom(
    "autograd.create_graph",
    "bool",
    "the script differentiates a gradient (torch.autograd.grad or backward with create_graph=True: a gradient "
    "penalty, a divergence, a meta-learning step): its backward is a double backward, which torch.compile's "
    "aot_autograd cannot run",
)
def create_graph(record: RunRecord) -> bool | None:
    calls = record.flags.get("create_graph_calls") if record.flags else None
    return calls > 0 if isinstance(calls, int) else None


@symptom("matmul.tf32", "bool", "TF32 matmuls allowed (allow_tf32 or float32_matmul_precision high/medium)")
def matmul_tf32(record: RunRecord) -> bool | None:
    if not record.flags:
        return None
    return bool(record.flags.get("matmul_allow_tf32")) or record.flags.get("float32_matmul_precision") in (
        "high",
        "medium",
    )


@symptom("model.conv_layers", "count", "convolution layers in the model")
def conv_layers(record: RunRecord) -> int | None:
    return sum(m.conv_layers for m in record.models) if record.models else None


@symptom("model.channels_last", "bool", "the model's convolution weights are channels_last")
def channels_last(record: RunRecord) -> bool | None:
    return record.models[0].channels_last if record.models else None


@symptom("model.compiled", "bool", "the script wraps the model in torch.compile (the trace's side: gpu.triton_share)")
def compiled(record: RunRecord) -> bool | None:
    return any(m.compiled for m in record.models) if record.models else None


@symptom("model.data_parallel", "bool", "the model is wrapped in nn.DataParallel")
def data_parallel(record: RunRecord) -> bool | None:
    return any(m.data_parallel for m in record.models) if record.models else None


@symptom("model.ddp", "bool", "the model is wrapped in DistributedDataParallel")
def ddp(record: RunRecord) -> bool | None:
    return any(m.distributed_data_parallel for m in record.models) if record.models else None


def _parallel(record: RunRecord, kind: str) -> dict[str, Any] | None:
    """The first model's settings of that parallel ``kind`` (``ModelInfo.parallel``), if any."""
    return next((m.parallel for m in record.models if m.parallel.get("kind") == kind), None)


@symptom("model.data_parallel_devices", "count", "devices nn.DataParallel spreads the model over (its device_ids)")
def data_parallel_devices(record: RunRecord) -> int | None:
    dp = _parallel(record, "DataParallel")
    return dp.get("devices") if dp else None


@symptom(
    "fsdp.prefetch_set",
    "bool",
    "the script sets FSDP's prefetch itself: FSDP2's set_modules_to_forward_prefetch and "
    "set_modules_to_backward_prefetch, or FSDP1's forward_prefetch=True with a backward_prefetch",
)
def fsdp_prefetch_set(record: RunRecord) -> bool | None:
    two, one = _parallel(record, "FSDP2"), _parallel(record, "FSDP1")
    if two:
        return bool(two.get("forward_prefetch_modules")) and bool(two.get("backward_prefetch_modules"))
    if one:
        return bool(one.get("forward_prefetch")) and one.get("backward_prefetch") is not None
    return None


@symptom(
    "fsdp.version",
    "",
    "which FSDP shards the model: 2 for FSDP2 (fully_shard), 1 for FSDP1 (FullyShardedDataParallel); "
    "absent without FSDP. Their settings are spelt differently: advice code follows it",
)
def fsdp_version(record: RunRecord) -> int | None:
    # FSDP2 first, as fsdp.prefetch_set reads it: the settings it reports are that wrapper's
    if _parallel(record, "FSDP2"):
        return 2
    return 1 if _parallel(record, "FSDP1") else None


@symptom("ddp.bucket_cap_mb", "MB", "DistributedDataParallel's bucket_cap_mb (torch's default: 25)")
def ddp_bucket_cap_mb(record: RunRecord) -> float | None:
    ddp = _parallel(record, "DDP")
    return ddp.get("bucket_cap_mb") if ddp else None

"""What the script set up, as the run record shows it: CPUs, backend flags, the model's wrappers."""

from __future__ import annotations

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


@symptom("matmul.tf32", "bool", "TF32 matmuls allowed (allow_tf32 or float32_matmul_precision high/medium)")
def matmul_tf32(record: RunRecord) -> bool | None:
    if not record.flags:
        return None
    return bool(record.flags.get("matmul_allow_tf32")) or record.flags.get("float32_matmul_precision") in ("high", "medium")


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

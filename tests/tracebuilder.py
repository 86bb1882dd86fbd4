"""Write Kineto-shaped traces by hand, with exact microseconds, for the arithmetic tests.

The event shapes copy what torch 2.11 writes on an H200 (see docs/analysis.md): host events
on pid 1/tid 1 (main) or tid 2 (autograd), GPU events on pid 0/tid 7 (stream 7), runtime calls
linked to GPU work through ``args.correlation``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN = 1
AUTOGRAD = 2
PID = 1
FP32_GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"
BF16_GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >"
MULTI_TENSOR = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4> >"
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@dataclass
class TraceBuilder:
    device: bool = True
    events: list[dict[str, Any]] = field(default_factory=list)
    _corr: int = 100

    def x(
        self, cat: str, name: str, ts: float, dur: float, tid: Any = MAIN, pid: Any = PID, **args: Any
    ) -> dict[str, Any]:
        event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        self.events.append(event)
        return event

    def step(self, number: int, ts: float, dur: float) -> None:
        self.x("user_annotation", f"ProfilerStep#{number}", ts, dur)

    def data_wait(self, ts: float, dur: float, workers: bool = False) -> None:
        kind = "_MultiProcessingDataLoaderIter" if workers else "_SingleProcessDataLoaderIter"
        self.x("user_annotation", f"enumerate(DataLoader)#{kind}.__next__", ts, dur)

    def optimizer(self, ts: float, dur: float, name: str = "AdamW") -> None:
        self.x("user_annotation", f"Optimizer.step#{name}.step", ts, dur)

    def op(self, name: str, ts: float, dur: float, tid: Any = MAIN, forward: bool = False) -> None:
        self.x("cpu_op", name, ts, dur, tid=tid)
        if forward:
            self.events.append(
                {"ph": "s", "id": len(self.events), "pid": PID, "tid": tid, "ts": ts, "cat": "fwdbwd", "name": "fwdbwd"}
            )

    def backward_op(self, ts: float, dur: float, tid: Any = AUTOGRAD, name: str = "AddmmBackward0") -> None:
        self.x("cpu_op", f"autograd::engine::evaluate_function: {name}", ts, dur, tid=tid)

    def runtime(self, name: str, ts: float, dur: float, tid: Any = MAIN) -> int:
        self._corr += 1
        self.x("cuda_runtime", name, ts, dur, tid=tid, correlation=self._corr, cbid=1)
        return self._corr

    def kernel(self, name: str, ts: float, dur: float, launch_ts: float, tid: Any = MAIN, stream: int = 7) -> None:
        corr = self.runtime("cudaLaunchKernel", launch_ts, 1, tid=tid)
        self.x("kernel", name, ts, dur, tid=stream, pid=0, device=0, stream=stream, correlation=corr)

    def memcpy(self, name: str, ts: float, dur: float, nbytes: int, launch_ts: float, launch_dur: float = 1) -> None:
        corr = self.runtime("cudaMemcpyAsync", launch_ts, launch_dur)
        self.x("gpu_memcpy", name, ts, dur, tid=7, pid=0, device=0, stream=7, correlation=corr, bytes=nbytes)

    def sync(self, ts: float, dur: float, name: str = "cudaStreamSynchronize") -> None:
        self.runtime(name, ts, dur)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.device:
            data["deviceProperties"] = [
                {
                    "id": 0,
                    "name": "NVIDIA H200",
                    "totalGlobalMem": 150109880320,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "numSms": 132,
                }
            ]
        return data

    def write(self, path: Path, gz: bool = False) -> Path:
        raw = json.dumps(self.to_dict()).encode()
        if gz:
            path.write_bytes(gzip.compress(raw))
        else:
            path.write_bytes(raw)
        return path


def one_gpu_step() -> TraceBuilder:
    """The reference step of tests/test_breakdown.py, every phase once (see the test for the sums)."""
    b = TraceBuilder()
    b.step(7, 0, 1000)
    b.data_wait(0, 300)
    b.op("aten::to", 300, 50)  # pageable host-to-device copy, with its own staging sync
    b.memcpy("Memcpy HtoD (Pageable -> Device)", 310, 30, 4096, launch_ts=305, launch_dur=35)
    b.sync(341, 7)
    b.op("aten::linear", 350, 10, forward=True)
    b.kernel(FP32_GEMM, 360, 140, launch_ts=355)
    b.op("aten::relu", 400, 10, forward=True)
    b.kernel(BF16_GEMM, 500, 100, launch_ts=405)
    b.backward_op(610, 90)
    b.kernel(ELEMENTWISE, 620, 180, launch_ts=620, tid=2)
    b.optimizer(700, 180)
    b.kernel(MULTI_TENSOR, 800, 50, launch_ts=710)
    b.op("aten::item", 900, 60)  # .item(): a read-back copy and a sync
    b.memcpy("Memcpy DtoH (Device -> Pageable)", 904, 2, 4, launch_ts=901, launch_dur=3)
    b.sync(905, 50)
    return b

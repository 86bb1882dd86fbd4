"""The names of the two views of a step, and their words: the bottom of the import graph.

Contract: constants only, no imports from diagnose. ``PHASES`` are what the host (main) thread
does; ``EXPOSED`` are what limits the step (host-side first, GPU idle; then GPU busy), in the
order every renderer shows them. The breakdown computes them, the symptoms name them
(``exposed.<category>``, ``phase.<phase>``), the renderers label them.
"""

from __future__ import annotations

PHASES = ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "other")

#: Exposed categories, in display order. Host-side first (GPU idle), then GPU busy.
EXPOSED = (
    "data_wait",
    "h2d_copy",
    "sync",
    "host_forward",
    "host_backward",
    "host_optimizer",
    "host_other",
    "communication",
    "gpu_forward",
    "gpu_backward",
    "gpu_optimizer",
    "gpu_other",
)
HOST_EXPOSED = EXPOSED[:7]
GPU_EXPOSED = EXPOSED[7:]
#: GPU idle while the host runs model code: on a GPU this is launch and Python overhead.
LAUNCH_EXPOSED = ("host_forward", "host_backward", "host_optimizer")

#: What each exposed category means, in words, on a run with a GPU.
EXPOSED_LABELS = {
    "data_wait": "waiting for data (DataLoader)",
    "h2d_copy": "host-to-device copies",
    "sync": "host-GPU syncs (.item(), .cpu(), ...)",
    "host_forward": "host: forward code, GPU idle",
    "host_backward": "host: backward, GPU idle",
    "host_optimizer": "host: optimizer, GPU idle",
    "host_other": "host: other Python, GPU idle",
    "communication": "communication (all-reduce ...), not overlapped",
    "gpu_forward": "GPU: forward kernels",
    "gpu_backward": "GPU: backward kernels",
    "gpu_optimizer": "GPU: optimizer kernels",
    "gpu_other": "GPU: other kernels and copies",
}
#: The same categories on a CPU-only run, where the host is the device.
EXPOSED_LABELS_CPU = {
    **EXPOSED_LABELS,
    "host_forward": "forward (CPU compute)",
    "host_backward": "backward (CPU compute)",
    "host_optimizer": "optimizer (CPU compute)",
    "host_other": "other Python",
}
PHASE_LABELS = {
    "data_wait": "data wait",
    "h2d_copy": "host-to-device copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer (with zero_grad)",
    "other": "other host work",
}
#: How the runner counted steps (``run.step_mode``), in words.
STEP_MODE_LABELS = {
    "optimizer": "optimizer step",
    "dataloader": "DataLoader batch (no optimizer step seen)",
    # an optimizer built and never stepped counts model calls after ``FORWARD_HOLD_S``
    "forward": "call of the model (no optimizer step, no DataLoader seen)",
}


def exposed_labels(on_gpu: bool) -> dict[str, str]:
    """The exposed categories' words: GPU wording on a GPU run, CPU wording on a CPU-only one."""
    return EXPOSED_LABELS if on_gpu else EXPOSED_LABELS_CPU


def exposed_categories(on_gpu: bool) -> tuple[str, ...]:
    """The exposed categories a run can have: all on a GPU, the host ones on a CPU-only run."""
    return EXPOSED if on_gpu else HOST_EXPOSED

"""What holds GPU memory: parameters, gradients, optimizer state, and what the step builds.

Contract: ``MemoryProbe`` measures one step: ``start()`` at a step boundary (finds the script's
models and optimizers once through the garbage collector, reads the allocator, resets its peak),
``stop(samples) -> MemorySplit`` at the next boundary. ``snapshot_at_oom(message)`` measures the
same owners when an out-of-memory error is raised, before the script unwinds and frees them.

The samples in the step come from the DataLoader when the script uses one (``stop(samples)``).
A script that makes its batch itself (``x = torch.randn(batch, ...)``) tells no DataLoader, and
without a sample count the headroom cannot become a batch size; so the probe also reads the
leading dimension of the first tensor passed to the first module with parameters called in the
step (the model's input: ``(batch, ...)``; an embedding's ``(batch, positions)``), and uses it
when no DataLoader told.

Sizes are the allocator's own figures (``torch.cuda.memory_stats``) and the byte sizes of the
tensors each owner holds, counted once per storage; ``analysis/measure/memory_breakdown.py`` turns them into the
split (activations are what the step allocated above what it started with) and advice.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from diagnose.record import MemorySplit

Stats = Callable[[], dict[str, int]]


def allocator_stats() -> dict[str, int]:
    """The caching allocator's figures for the current device, and the device's capacity."""
    import torch

    stats = torch.cuda.memory_stats()
    _, total = torch.cuda.mem_get_info()
    return {
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "peak_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "peak_reserved": int(stats.get("reserved_bytes.all.peak", 0)),
        "capacity": int(total),
    }


def find_owners() -> tuple[list[Any], list[Any]]:
    """The live ``nn.Module`` and ``torch.optim.Optimizer`` objects (one walk of the gc)."""
    import torch

    modules: list[Any] = []
    optimizers: list[Any] = []
    with warnings.catch_warnings():  # isinstance() wakes lazy torch objects that warn when touched
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.nn.Module):
                    modules.append(o)
                elif isinstance(o, torch.optim.Optimizer):
                    optimizers.append(o)
            except ReferenceError:
                continue
    return modules, optimizers


def _storage_key(t: Any) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - a tensor without a storage (sparse, nested, a tensor subclass): its own identity
        return id(t)


def _storage_bytes(t: Any) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - a tensor without a storage: its elements' bytes
        return int(t.numel() * t.element_size())


def sum_bytes(tensors: Iterable[Any], device_type: str, seen: set[int]) -> int:
    """Bytes of the distinct storages among ``tensors`` on ``device_type`` not in ``seen``."""
    total = 0
    for t in tensors:
        if t is None or getattr(t, "device", None) is None or t.device.type != device_type:
            continue
        key = _storage_key(t)
        if key in seen:
            continue
        seen.add(key)
        total += _storage_bytes(t)
    return total


def owner_bytes(modules: list[Any], optimizers: list[Any], device_type: str = "cuda") -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes on ``device_type``, each storage once."""
    import torch

    params: list[Any] = []
    for m in modules:
        try:
            params.extend(m.parameters())
        except ReferenceError:
            continue
    for opt in optimizers:
        params.extend(p for group in opt.param_groups for p in group["params"])
    seen: set[int] = set()
    p_bytes = sum_bytes(params, device_type, seen)
    g_bytes = sum_bytes((p.grad for p in params), device_type, seen)
    state: list[Any] = []
    for opt in optimizers:
        for per_param in opt.state.values():
            if isinstance(per_param, dict):
                state.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    o_bytes = sum_bytes(state, device_type, seen)
    return p_bytes, g_bytes, o_bytes


class MemoryProbe:
    """Measures one step. ``stats`` and ``device_type`` are for tests on machines with no GPU."""

    def __init__(
        self, stats: Stats | None = None, device_type: str = "cuda", reset_peak: Callable[[], None] | None = None
    ) -> None:
        self._stats = stats or allocator_stats
        self._device_type = device_type
        self._reset_peak = reset_peak
        self._modules: list[Any] = []
        self._optimizers: list[Any] = []
        self._start: dict[str, int] | None = None
        self._grads_start = 0
        self._input_hook: Any = None
        #: the leading dimension of the model's input in the measured step (0: not seen yet)
        self.input_batch = 0
        #: its first two dimensions (batch-first or sequence-first: which one holds the samples
        #: is the script's to say, ``runner`` asks its batch option)
        self.input_dims: tuple[int, ...] = ()
        self.result: MemorySplit | None = None

    def start(self) -> None:
        if self._start is not None or self.result is not None:
            return
        self._modules, self._optimizers = find_owners()
        _, self._grads_start, _ = owner_bytes(self._modules, self._optimizers, self._device_type)
        self._watch_input()
        if self._reset_peak is not None:
            self._reset_peak()
        else:
            import torch

            torch.cuda.reset_peak_memory_stats()
        self._start = self._stats()

    def stop(self, samples: int | None = None) -> MemorySplit | None:
        if self._start is None:
            return self.result
        start, self._start = self._start, None
        self._unwatch_input()
        end = self._stats()
        p, g, o = owner_bytes(self._modules, self._optimizers, self._device_type)
        self._modules, self._optimizers = [], []
        self.result = MemorySplit(
            when="step",
            parameters_bytes=p,
            gradients_bytes=g,
            optimizer_state_bytes=o,
            allocated_start_bytes=start["allocated"],
            allocated_end_bytes=end["allocated"],
            gradients_start_bytes=self._grads_start,
            peak_allocated_bytes=end["peak_allocated"],
            peak_reserved_bytes=end["peak_reserved"],
            reserved_bytes=end["reserved"],
            capacity_bytes=end["capacity"],
            samples=samples or self.input_batch or None,
        )
        return self.result

    def _watch_input(self) -> None:
        """Until the step's first module with parameters is called with a tensor, read that
        tensor's leading dimension (one global pre-hook, removed once it has seen one)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        from diagnose.runtime.instrument import first_shape

        def first_input(module: Any, args: Any) -> None:
            if self.input_batch or next(module.parameters(), None) is None:
                return
            shape = first_shape(args)
            if shape is None:
                return
            self.input_batch, self.input_dims = (shape[0] if shape else 1), shape[:2]
            self._unwatch_input()

        self._input_hook = register_module_forward_pre_hook(first_input)

    def _unwatch_input(self) -> None:
        if self._input_hook is not None:
            self._input_hook.remove()
            self._input_hook = None


def snapshot_at_oom(
    message: str, samples: int | None = None, stats: Stats | None = None, device_type: str = "cuda"
) -> MemorySplit:
    """The owners' sizes and the allocator's figures at the moment an out-of-memory error is
    made (its ``__init__``), before the script's frames unwind and free the activations."""
    figures = (stats or allocator_stats)()
    modules, optimizers = find_owners()
    p, g, o = owner_bytes(modules, optimizers, device_type)
    return MemorySplit(
        when="oom",
        parameters_bytes=p,
        gradients_bytes=g,
        optimizer_state_bytes=o,
        allocated_start_bytes=figures["allocated"],
        allocated_end_bytes=figures["allocated"],
        gradients_start_bytes=g,
        peak_allocated_bytes=figures["peak_allocated"],
        peak_reserved_bytes=figures["peak_reserved"],
        reserved_bytes=figures["reserved"],
        capacity_bytes=figures["capacity"],
        samples=samples if samples else None,
        message=message.splitlines()[0] if message else None,
    )

"""Profiler annotations that let the analysis tell the optimizer's own work from the model's.

torch annotates ``optimizer.step()`` and ``optimizer.zero_grad()`` itself, but not the closure a
``step(closure)`` calls (Lightning's automatic optimization, LBFGS: forward and backward run
inside the step), nor gradient clipping, GradScaler's ``unscale_``/``step``/``update`` or
``Module.zero_grad`` (the HF Trainer's). ``PhaseMarks`` wraps each in a
``torch.profiler.record_function`` whose name ``diagnose.analysis.trace.patterns`` knows:

* ``diagnose#optimizer_closure``: the closure (the analysis counts forward and backward inside
  it as forward and backward, the rest as other host work, never as optimizer work);
* ``diagnose#clip_grad_norm_`` / ``diagnose#clip_grad_value_``: gradient clipping, counted as
  optimizer work, as Lightning, the HF Trainer and accelerate place it (right before the step);
* ``diagnose#GradScaler.unscale_`` / ``.step`` / ``.update``: the fp16 loss scaler's share of the
  step, optimizer work;
* ``diagnose#Module.zero_grad``: ``model.zero_grad()``, optimizer work like ``optimizer.zero_grad()``;
* ``diagnose#backward``: a framework's own backward call (Lightning Fabric's ``fabric.backward``,
  patched by ``runtime/frameworkwatch.py`` when Fabric is imported: ``backward_mark``), whose whole
  span is backward (the precision plugin's loss scaling and the strategy's hooks around the
  autograd engine), never other host work.

Nothing else changes: every wrapper calls the original with the same arguments and returns its
result. Inside code that torch.compile traces the annotation is left out (no graph break), and
so it is while no profiler records on the calling thread (a ``record_function`` with none costs
about 6 µs, two operator calls: with GradScaler, clipping and ``model.zero_grad()`` five of them
a step, 30 µs of every step past the window, where nothing reads them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from diagnose.runtime.patching import wrap_attribute

CLOSURE = "diagnose#optimizer_closure"
BACKWARD = "diagnose#backward"


def _annotated(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    record_function = torch.profiler.record_function
    is_compiling = torch.compiler.is_compiling
    recording = _profiler_on_this_thread()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_compiling() or not recording():
            return fn(*args, **kwargs)
        with record_function(name):
            return fn(*args, **kwargs)

    wrapper.__diagnose_original__ = fn  # type: ignore[attr-defined]
    return wrapper


def _profiler_on_this_thread() -> Callable[[], bool]:
    """Whether a profiler records this thread's annotations now (torch's profilers enable their
    callbacks per thread: a ``record_function`` on another thread is in no trace). Where torch
    has no such query, always: the annotation is then made as before."""
    import torch

    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    return enabled if callable(enabled) else (lambda: True)


def backward_mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a framework's backward method) annotated as the backward pass."""
    return _annotated(BACKWARD, fn)


def _closure_pre_hook(optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
    """Wrap the closure of ``optimizer.step(closure)``; ``args[0]`` is the optimizer itself."""
    if kwargs.get("closure") is not None:
        kwargs = dict(kwargs, closure=_annotated(CLOSURE, kwargs["closure"]))
        return args, kwargs
    if len(args) > 1 and callable(args[1]):
        return (args[0], _annotated(CLOSURE, args[1]), *args[2:]), kwargs
    return None


class PhaseMarks:
    """Installs the annotations; ``remove`` undoes every patch in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        import torch
        import torch.nn.utils.clip_grad as clip_module
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(_closure_pre_hook)
        self._undo.append(handle.remove)
        for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"):
            for owner in (torch.nn.utils, clip_module):
                if hasattr(owner, name):
                    self._wrap(owner, name, f"diagnose#{name}")
        scaler = getattr(torch.amp, "GradScaler", None)
        if scaler is not None:
            for method in ("unscale_", "step", "update"):
                self._wrap(scaler, method, f"diagnose#GradScaler.{method}")
        self._wrap(torch.nn.Module, "zero_grad", "diagnose#Module.zero_grad")

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        self._undo.append(wrap_attribute(owner, name, functools.partial(_annotated, label)))

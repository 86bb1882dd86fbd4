"""FLOPs and memory traffic of one training step, counted without editing the script.

Contract: ``StepCounter`` is armed by the runner at a step boundary and disarmed at the next
one; between the two, a ``TorchDispatchMode`` sees every aten operator the step runs (forward,
backward on the autograd threads, optimizer) and adds up, per operator and per phase:

- FLOPs from torch's own formulas (``torch.utils.flop_counter.flop_registry``: matmul,
  convolution, attention), the FLOPs that MFU counts;
- tensor bytes read and written, views not counted (an estimate: a kernel may read an input
  twice, or keep it in cache);
- elements in and out, from which the analysis estimates elementwise and reduction FLOPs;
- the shapes and dtypes of matmuls and convolutions (dtype as the kernel sees it, after
  autocast).

Which step: the one after the profiled window (``WindowPlan.warmup + steps``), which absorbs
the trace export and is never measured; the dispatch mode makes that step several times slower
(a Python call per operator), so it must be a step nobody times. A compiled model runs eagerly
for that step, which is what lets its operators be counted: the counter sets torch.compile's
stance to ``force_eager`` while the mode is active, and puts the script's stance back after.
Without it, dynamo shown a compiled frame under a dispatch mode gives that code up for good: the
model ran eagerly for the rest of the script, and the timed steps after the window measured an
eager model (every compile experiment of verify measured about 1.0x).

Phase: ``backward`` while the autograd engine runs a graph task (its operators run on engine
threads, which inherit the mode), ``optimizer`` between an optimizer's step pre- and post-hooks,
``forward`` otherwise (the loss and input copies included).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from diagnose.record import FlopCount, MatmulShape, OpCount

PHASES = ("forward", "backward", "optimizer")

#: operators whose shapes are kept (``MatmulShape``): the ones that can waste Tensor Cores
_MATMUL_OPS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}
_CONV_OPS = {"aten.convolution", "aten._convolution", "aten.cudnn_convolution"}
#: at most this many distinct shapes are kept, the ones with the most FLOPs
MAX_SHAPES = 32


def tensor_bytes(t: Any) -> int:
    """Bytes a kernel touches for tensor ``t``: its elements, but never more than its storage
    (an expanded tensor repeats one storage many times)."""
    nbytes = t.numel() * t.element_size()
    try:
        storage = t.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001 - sparse, nested or storage-less tensors
        return nbytes
    return min(nbytes, storage)


class _Totals:
    def __init__(self) -> None:
        self.ops: dict[str, OpCount] = defaultdict(OpCount)
        self.flops_by_phase: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.bytes_by_phase: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.shapes: dict[tuple[str, int, int, int, str], MatmulShape] = {}


def matmul_dims(op: str, args: tuple[Any, ...]) -> tuple[int, int, int] | None:
    """``(m, n, k)`` of a matmul (batch folded into ``m``) or a convolution (input pixels times
    batch, output channels, input channels per group)."""
    shapes = [tuple(a.shape) for a in args if hasattr(a, "shape")]
    if op in ("aten.mm",) and len(shapes) >= 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return m, n, k
    if op == "aten.addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1], shapes[2]
        return m, n, k
    if op == "aten.bmm" and len(shapes) >= 2:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return b * m, n, k
    if op == "aten.baddbmm" and len(shapes) >= 3:
        (b, m, k), (_, _, n) = shapes[1], shapes[2]
        return b * m, n, k
    if op in _CONV_OPS and len(shapes) >= 2 and len(shapes[1]) >= 3:
        x, w = shapes[0], shapes[1]
        pixels = 1
        for d in x[2:]:
            pixels *= d
        return x[0] * pixels, w[0], w[1]
    return None


class StepCounter:
    """Counts one step. ``start(step)`` at a boundary, ``stop(samples)`` at the next one; both
    are safe to call twice, and ``stop`` is safe to call when nothing started. ``close()``
    when the script has ended."""

    def __init__(self, device_type: str | None = None) -> None:
        #: count only operators with a tensor on this device ("cuda": leave out the DataLoader's
        #: collation and other CPU work); None counts everything (a CPU-only run)
        self.device_type = device_type
        self.result: FlopCount | None = None
        self._mode: Any = None
        self._hooks: list[Any] = []
        self._step = -1
        self._started = 0.0
        self._in_optimizer = 0
        self._totals = _Totals()
        self._restore_stance: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self, step: int) -> None:
        if self._mode is not None or self.result is not None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._step = step
        self._totals = _Totals()
        self._hooks = [
            register_optimizer_step_pre_hook(self._optimizer_entered),
            register_optimizer_step_post_hook(self._optimizer_left),
        ]
        self._mode = _make_mode(self)
        self._started = time.perf_counter()
        self._restore_stance = _force_eager()
        self._mode.__enter__()

    def stop(self, samples: int | None = None) -> FlopCount | None:
        if self._mode is None:
            return self.result
        mode, self._mode = self._mode, None
        self._in_optimizer = 0
        mode.__exit__(None, None, None)
        restore, self._restore_stance = self._restore_stance, None
        if restore is not None:
            restore()
        t = self._totals
        shapes = sorted(t.shapes.values(), key=lambda s: -s.flops)
        notes = []
        if len(shapes) > MAX_SHAPES:
            notes.append(f"{len(shapes)} distinct matmul shapes; the {MAX_SHAPES} with the most FLOPs kept")
        self.result = FlopCount(
            step=self._step,
            seconds=time.perf_counter() - self._started,
            total=sum(t.flops_by_phase.values()),
            by_phase=dict(t.flops_by_phase),
            bytes_by_phase=dict(t.bytes_by_phase),
            ops=dict(t.ops),
            matmuls=shapes[:MAX_SHAPES],
            samples=samples if samples else None,
            notes=notes,
        )
        return self.result

    def close(self) -> None:
        """Remove the optimizer hooks. Not done in ``stop``: a step boundary is often found inside
        an optimizer post-hook, and removing a hook while torch iterates over them fails."""
        self.stop()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # --- called from the mode and the hooks ------------------------------------------------------

    def _optimizer_entered(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._mode is not None:
            self._in_optimizer += 1

    def _optimizer_left(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._mode is not None:
            self._in_optimizer = max(0, self._in_optimizer - 1)

    def phase(self) -> str:
        import torch

        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "optimizer" if self._in_optimizer else "forward"

    def count(
        self, op: str, flops: int, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, is_view: bool
    ) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        if self.device_type is not None and not any(t.device.type == self.device_type for t in (*inputs, *outputs)):
            return
        entry = self._totals.ops[op]
        entry.calls += 1
        entry.flops += flops
        phase = self.phase()
        self._totals.flops_by_phase[phase] += flops
        if is_view:
            return  # a view moves no data
        nbytes = sum(tensor_bytes(t) for t in inputs) + sum(tensor_bytes(t) for t in outputs)
        entry.bytes += nbytes
        entry.elements_in += sum(t.numel() for t in inputs)
        entry.elements_out += sum(t.numel() for t in outputs)
        self._totals.bytes_by_phase[phase] += nbytes
        if flops and (op in _MATMUL_OPS or op in _CONV_OPS):
            dims = matmul_dims(op, args)
            if dims is not None:
                dtype = str(inputs[-1].dtype).replace("torch.", "") if inputs else "unknown"
                key = (op, *dims, dtype)
                shape = self._totals.shapes.get(key)
                if shape is None:
                    shape = self._totals.shapes[key] = MatmulShape(op, dims[0], dims[1], dims[2], dtype)
                shape.calls += 1
                shape.flops += flops


def _force_eager() -> Callable[[], None] | None:
    """Make compiled code run eagerly until the returned callable puts the stance back; None when
    dynamo was never imported (nothing is compiled) or this torch has no stances."""
    if "torch._dynamo" not in sys.modules:
        return None
    try:
        import torch
        from torch._dynamo import eval_frame

        before = eval_frame._stance
        torch.compiler.set_stance("force_eager")
    except Exception:  # noqa: BLE001 - an older torch: no stances
        return None

    def restore() -> None:
        try:
            eval_frame._stance = before
        except Exception:  # noqa: BLE001 - restoring a private attribute must never break the script
            pass

    return restore


def _make_mode(counter: StepCounter) -> Any:
    """The dispatch mode (built here so that importing this module does not import torch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class _StepFlopMode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            packet = func._overloadpacket
            if packet not in flop_registry and isinstance(func, torch._ops.OpOverload):
                # a composite operator with no formula of its own: count what it decomposes into
                # (what torch's FlopCounterMode does too)
                with self:
                    decomposed = func.decompose(*args, **kwargs)
                if decomposed is not NotImplemented:
                    return decomposed
            out = func(*args, **kwargs)
            try:
                flops = int(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0
                counter.count(str(packet), flops, args, kwargs, out, _is_view(func))
            except Exception:  # noqa: BLE001 - counting must never break the script's step
                pass
            return out

    return _StepFlopMode()


def _is_view(func: Any) -> bool:
    """The operator returns an alias of an input without writing it (a view: no data moves)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)

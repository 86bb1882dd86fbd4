"""Hooks that find training steps in an unmodified script, and record what it configured.

This is the runner's hook registry: the only module-level mutable state in the project lives in
an ``Instrumentation`` instance, installed before the script runs and removed after it.

Step boundaries, without edits to the script, from the strongest signal seen so far:

1. optimizer steps (``torch.optim.optimizer.register_optimizer_step_post_hook``). When the loop
   draws batches from a DataLoader, the boundary is the first fetch after the step, so that a
   step is "fetch, forward, backward, step" and several optimizers (a GAN) or gradient
   accumulation still make one step per iteration;
2. DataLoader fetches, for loops with no optimizer (inference, evaluation);
3. calls of the outermost module, for loops with neither.

A stronger signal restarts the count: warm-up steps are counted in the final mode only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from diagnose.record import DataLoaderInfo, ModelInfo, OptimizerInfo
from diagnose.runtime.patching import wrap_attribute
from diagnose.runtime.usercode import first_user_frame, is_generated, library_prefixes, user_frame

MODES = ("forward", "dataloader", "optimizer")  # weakest to strongest
#: how long after the script builds an optimizer its model's calls are not counted as steps while
#: the optimizer has not stepped: a loop that builds one steps it, and what it calls before the
#: first step can be a module called many times a step (torchdiffeq's latent ODE steps an RNN
#: cell 100 times in Python, and an adaptive solver calls its ODE function dozens of times,
#: before the first optimizer step: each call had been counted as a step, and the window ended
#: inside the first training step). Past it, a script that built an optimizer it never steps is
#: counted by its model's calls as before.
FORWARD_HOLD_S = 60.0

BoundaryCallback = Callable[[float], None]
ResetCallback = Callable[[str], None]


class StepClock:
    """Turns hook calls into step boundaries and reports them to the capture session."""

    def __init__(self, on_boundary: BoundaryCallback, on_reset: ResetCallback) -> None:
        self.mode: str | None = None
        self._on_boundary = on_boundary
        self._on_reset = on_reset
        self._pending = False
        #: when the last boundary was reported: the start of the step in progress
        self._last_boundary_at: float | None = None
        self._fetches_since_step = 0
        self._fetched_last_iteration = False
        self._lead_optimizer: int | None = None
        self._lead_module: int | None = None
        #: when the lead optimizer last stepped: the end of the step in progress, should no
        #: fetch follow to commit its boundary (the script's last step)
        self._stepped_at: float | None = None
        #: whether the signal being handled is the one that reset the count: its boundaries come
        #: from inside the step that found the stronger signal (``CaptureSession.on_reset``)
        self.in_reset_call = False
        self.samples_this_step = 0
        self.samples_per_step: list[int] = []
        #: batches delivered in each step, and the first one's samples (record.even_out_epoch_turns)
        self.batches_this_step: list[int] = []
        self.batches_per_step: list[tuple[int, int]] = []
        #: seconds spent inside DataLoader ``__next__`` since the start (``diagnose watch``'s
        #: data wait: two clock reads a batch)
        self.data_wait_s = 0.0
        #: ``time.perf_counter()`` when the last optimizer step ended (the last step of an epoch
        #: ends there, not at the next epoch's first batch)
        self.last_optimizer_step_at: float | None = None
        #: when the script built its first optimizer (``FORWARD_HOLD_S``), and the lead module's
        #: first call while its calls were held back: where the first step began, should the
        #: optimizer's first step end it
        self._optimizer_built_at: float | None = None
        self._held_call_at: float | None = None

    def optimizer_built(self) -> None:
        """The script built an optimizer: until it steps (for ``FORWARD_HOLD_S``), model calls are no steps."""
        if self._optimizer_built_at is None:
            self._optimizer_built_at = time.perf_counter()

    def _use_mode(self, mode: str) -> bool:
        """Switch to ``mode`` if it is stronger; return whether signals of ``mode`` count."""
        if self.mode == mode:
            return True
        if self.mode is None or MODES.index(mode) > MODES.index(self.mode):
            step_started = self._last_boundary_at if self._last_boundary_at is not None else self._held_call_at
            self.mode = mode
            self.samples_per_step = []
            self.batches_per_step = []
            self.in_reset_call = True
            self._on_reset(mode)
            if mode == "optimizer" and step_started is not None:
                # The first optimizer step ends a step that began at the weaker signal's last
                # boundary (the fetch or the model call): that step counts too, else a script of
                # 3 optimizer steps would be reported as 2. Its samples stay with it.
                self.samples_per_step.append(0)
                self.batches_per_step.append((0, 0))
                self._last_boundary_at = step_started
                self._on_boundary(step_started)
            return True
        return False

    def _close_step(self) -> None:
        self.samples_per_step.append(self.samples_this_step)
        batches = self.batches_this_step
        self.batches_per_step.append((len(batches), batches[0] if batches else 0))
        self.samples_this_step = 0
        self.batches_this_step = []

    def _boundary(self) -> None:
        self._close_step()
        self._last_boundary_at = time.perf_counter()
        self._on_boundary(self._last_boundary_at)

    # --- signals ------------------------------------------------------------------------------

    def optimizer_stepped(self, optimizer_id: int) -> None:
        self.last_optimizer_step_at = time.perf_counter()
        self.in_reset_call = False
        self._use_mode("optimizer")
        if self._lead_optimizer is None:
            self._lead_optimizer = optimizer_id
            self._fetched_last_iteration = self._fetches_since_step > 0
        uses_loader = self._fetches_since_step > 0 or self._fetched_last_iteration
        self._fetched_last_iteration = self._fetches_since_step > 0
        self._fetches_since_step = 0
        if uses_loader:
            self._pending = True  # the boundary is the next fetch
            self._stepped_at = time.perf_counter()
        elif optimizer_id == self._lead_optimizer:
            self._boundary()

    def batch_requested(self) -> None:
        """Called before the DataLoader produces a batch."""
        self.in_reset_call = False
        self._fetches_since_step += 1
        if self.mode == "optimizer":
            if self._pending:
                self._pending = False
                self._boundary()
        elif self._use_mode("dataloader"):
            self._boundary()

    def last_step_end(self) -> float | None:
        """The script ended: the end of a step whose boundary still waits for a fetch (its
        optimizer step ran, no fetch followed), so that the last step ends at its optimizer
        step and what the script does after it (teardown, a checkpoint, evaluation) is in no
        step. Counts the step's samples; None when no step is pending."""
        if not self._pending or self._stepped_at is None:
            return None
        self._pending = False
        self._close_step()
        self._last_boundary_at = self._stepped_at
        return self._stepped_at

    def batch_delivered(self, samples: int) -> None:
        self.samples_this_step += samples
        self.batches_this_step.append(samples)

    def module_called(self, module_id: int) -> None:
        self.in_reset_call = False
        if self.mode is not None and self.mode != "forward":
            return
        if self._lead_module is None:
            self._lead_module = module_id
        if module_id != self._lead_module:
            return
        built = self._optimizer_built_at
        if built is not None and self.last_optimizer_step_at is None:
            now = time.perf_counter()
            if now - built < FORWARD_HOLD_S:
                if self._held_call_at is None and self._last_boundary_at is None:
                    self._held_call_at = now
                return
        if self._use_mode("forward"):
            self._boundary()


@contextlib.contextmanager
def warnings_keep_their_origin() -> Iterator[None]:
    """Around a patched constructor's call of the original: a warning the original issues with
    ``stacklevel=2`` names its caller, which is now our wrapper in this file. Re-issue it at the
    frame that called the wrapper, where it pointed before we patched anything (torch's own file,
    or the user's line); other warnings are re-issued as they were. Constructors only: catching
    warnings resets the filters' registries, too costly for every batch."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    wrapper = sys._getframe(2)  # 0: here, 1: contextlib, 2: the wrapper
    caller = wrapper.f_back
    for w in caught:
        filename, lineno, module_globals = w.filename, w.lineno, None
        if os.path.abspath(w.filename) == os.path.abspath(__file__) and caller is not None:
            filename, lineno, module_globals = caller.f_code.co_filename, caller.f_lineno, caller.f_globals
        module = (module_globals or {}).get("__name__") or os.path.splitext(os.path.basename(filename))[0]
        registry = (module_globals if module_globals is not None else {}).setdefault("__warningregistry__", {})
        warnings.warn_explicit(
            w.message, w.category, filename, lineno, module=module, registry=registry, module_globals=module_globals
        )


def first_shape(batch: Any, depth: int = 0) -> tuple[int, ...] | None:
    """The shape of the first tensor found in a batch (a tensor, or lists, tuples and dicts of
    them, three levels deep); None where there is none."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return tuple(int(n) for n in shape)
    if depth < 3:
        if isinstance(batch, (list, tuple)) and batch:
            return first_shape(batch[0], depth + 1)
        if isinstance(batch, dict) and batch:
            return first_shape(next(iter(batch.values())), depth + 1)
    return None


def leading_dim(batch: Any) -> int:
    """Samples in a batch: the first dimension of the first tensor found in it (at every batch:
    a tensor's first dimension read alone, not its whole shape)."""
    shape = getattr(batch, "shape", None)
    if shape is None:
        shape = first_shape(batch)
        if shape is None:
            return 0
    return int(shape[0]) if len(shape) else 1


class Instrumentation:
    """Installs and removes every hook; collects DataLoader, optimizer and model facts."""

    def __init__(self, clock: StepClock, knobs: Any | None = None) -> None:
        self.clock = clock
        self.knobs = knobs
        self.dataloaders: dict[int, DataLoaderInfo] = {}
        self.optimizers: dict[int, OptimizerInfo] = {}
        self._optimizer_sites: dict[int, str | None] = {}
        self.in_window = False
        #: a CUDA out-of-memory error was raised, even if the script caught it and exited
        self.oom_message: str | None = None
        #: calls of ``torch.autograd.grad`` / ``backward`` with ``create_graph=True`` (a double backward)
        self.create_graph_calls = 0
        #: every backward (``torch.autograd.backward``/``grad``) and optimizer step, counted: an
        #: evaluation pass is a stretch in eval mode in which neither grew (``evalspans``)
        self.trained = 0
        #: called once with the message when the first out-of-memory error is made
        self.on_oom: Callable[[str], None] | None = None
        self._undo: list[Callable[[], None]] = []
        self._forward_hook: Any = None
        self._prefixes: tuple[str, ...] = ()
        self._framework_watch: Any = None
        self.phase_marks: Any = None
        self.compile_watch: Any = None
        #: the training process: a DataLoader worker forked from it inherits the module hook,
        #: and a Dataset's nn.Module transforms (torchvision's) are no steps of the loop
        self._pid = os.getpid()

    # --- install / remove ---------------------------------------------------------------------

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import DataLoader
        from torch.utils.data import dataloader as dl_module

        self._prefixes = library_prefixes()
        handle = register_optimizer_step_post_hook(self._optimizer_post_hook)
        self._undo.append(handle.remove)
        self._patch(DataLoader, "__init__", self._wrap_loader_init)
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)
        self._patch(DataLoader, "__iter__", self._wrap_loader_iter)
        self._patch(dl_module._BaseDataLoaderIter, "__init__", self._wrap_iter_init)
        self._patch(dl_module._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._forward_pre_hook)
        # create_graph is their fifth and fourth parameter (Tensor.backward passes it by position)
        self._patch(torch.autograd, "grad", functools.partial(self._wrap_differentiation, position=4))
        self._patch(torch.autograd, "backward", functools.partial(self._wrap_differentiation, position=3))
        oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        self._patch(oom, "__init__", self._wrap_oom_init)
        # torch.compile warns once that a global hook exists; it is ours and harmless.
        warnings.filterwarnings("ignore", message=r".*global hooks on modules.*")
        self._watch_frameworks()
        self._install_phase_marks_and_compile_watch()

    def _install_phase_marks_and_compile_watch(self) -> None:
        """Annotations for the optimizer's own work (closures, clipping, GradScaler) and the
        observer of torch.compile calls; both removed with the rest in ``remove``."""
        from diagnose.runtime.compilewatch import CompileWatch
        from diagnose.runtime.marks import PhaseMarks

        self.phase_marks = PhaseMarks()
        self.phase_marks.install()
        self._undo.append(self.phase_marks.remove)
        prefixes = self._prefixes
        self.compile_watch = CompileWatch(
            user_frame=lambda: user_frame(prefixes),
            # the compile knob reaches a script that compiles itself through its own calls
            knob_hook=self.knobs.script_compile if self.knobs is not None else None,
            is_library=lambda filename: filename.startswith(prefixes) or is_generated(filename),
        )
        self.compile_watch.install()
        self._undo.append(self.compile_watch.remove)

    def remove(self) -> None:
        self.drop_forward_hook(force=True)
        while self._undo:
            self._undo.pop()()

    # --- training frameworks (runtime/frameworkwatch.py) ----------------------------------------------

    def _watch_frameworks(self) -> None:
        """Record the Lightning / HF / accelerate objects the script builds (never importing a
        framework it does not use), and let the knobs take their switches."""
        from diagnose.runtime.frameworkwatch import FrameworkWatch

        prefixes = self._prefixes

        def site() -> str | None:
            frame = first_user_frame(sys._getframe(1), prefixes)
            return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None

        knob_hook = self.knobs.framework_changes if self.knobs is not None else None
        self._framework_watch = FrameworkWatch(site, knob_hook, prefixes)
        self._framework_watch.install()
        self._undo.append(self._framework_watch.remove)

    def frameworks_seen(self) -> list[Any]:
        """``FrameworkInfo`` of every framework object the script built, in order."""
        return list(self._framework_watch.seen) if self._framework_watch is not None else []

    def drop_forward_hook(self, force: bool = False) -> None:
        """The forward hook only finds steps in loops with no optimizer and no DataLoader. Remove
        it once a stronger signal exists, unless torch.compile already compiled code while it was
        installed (removing it would invalidate a guard and recompile the model)."""
        if self._forward_hook is None:
            return
        if not force and _dynamo_compiled_something():
            return
        self._forward_hook.remove()
        self._forward_hook = None

    def _patch(self, owner: Any, name: str, wrapper_factory: Callable[[Any], Any]) -> None:
        self._undo.append(wrap_attribute(owner, name, wrapper_factory))

    # --- hooks ----------------------------------------------------------------------------------

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.trained += 1
        key = id(optimizer)
        if key not in self.optimizers:
            self.optimizers[key] = describe_optimizer(optimizer)
            self.optimizers[key].created_at = self._optimizer_sites.get(key)
        self.clock.optimizer_stepped(key)
        if self._forward_hook is not None and self.clock.mode == "optimizer":
            self.drop_forward_hook()

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        import torch

        if torch.compiler.is_compiling() or os.getpid() != self._pid:
            return
        if self.knobs is not None and self.knobs.compile_mode() is not None:
            self.knobs.maybe_compile(module)
        if self.clock.mode in (None, "forward"):
            self.clock.module_called(id(module))

    def _wrap_optimizer_init(self, original: Callable[..., None]) -> Callable[..., None]:
        instrumentation = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            with warnings_keep_their_origin():
                original(optimizer, *args, **kwargs)
            instrumentation._optimizer_sites.setdefault(id(optimizer), user_frame(instrumentation._prefixes))
            if os.getpid() == instrumentation._pid:  # one built in a DataLoader worker steps no loop of ours
                instrumentation.clock.optimizer_built()

        return __init__

    def _wrap_differentiation(self, original: Callable[..., Any], position: int) -> Callable[..., Any]:
        """``torch.autograd.grad`` / ``backward`` (``Tensor.backward`` calls the latter): counts the
        calls that build a graph of the gradient (``create_graph=True``: a gradient penalty, a
        divergence, a meta-learning step), whose backward is a double backward, which
        torch.compile's aot_autograd cannot run (``create_graph_calls``)."""
        import torch

        instrumentation = self
        is_compiling = torch.compiler.is_compiling

        @functools.wraps(original)
        def differentiate(*args: Any, **kwargs: Any) -> Any:
            create_graph = (
                kwargs["create_graph"] if "create_graph" in kwargs else len(args) > position and args[position]
            )
            instrumentation.trained += 1
            if create_graph and not is_compiling():
                instrumentation.create_graph_calls += 1
            return original(*args, **kwargs)

        return differentiate

    def _wrap_oom_init(self, original: Callable[..., None]) -> Callable[..., None]:
        instrumentation = self

        def __init__(error: Any, *args: Any, **kwargs: Any) -> None:
            original(error, *args, **kwargs)
            if instrumentation.oom_message is None:
                message = str(args[0] if args else "CUDA out of memory")
                instrumentation.oom_message = message.splitlines()[0]
                if instrumentation.on_oom is not None:
                    try:
                        instrumentation.on_oom(message)
                    except Exception:  # noqa: BLE001 - measuring must never replace the script's own error
                        pass

        return __init__

    def _wrap_loader_init(self, original: Callable[..., None]) -> Callable[..., None]:
        instrumentation = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            applied: dict[str, Any] = {}
            if instrumentation.knobs is not None:
                args, kwargs, applied = instrumentation.knobs.apply_to_dataloader(original, loader, args, kwargs)
            with warnings_keep_their_origin():
                original(loader, *args, **kwargs)
            instrumentation._record_loader(loader, applied)

        return __init__

    def _record_loader(self, loader: Any, applied: dict[str, Any]) -> None:
        dataset = getattr(loader, "dataset", None)
        try:
            length = len(dataset)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a dataset's own __len__ may raise anything: no length then
            length = None
        created_at = user_frame(self._prefixes)
        earlier = self.dataloaders.get(id(loader))
        if earlier is not None and earlier.created_at == created_at and earlier.num_workers == int(loader.num_workers):
            # the same line made it again (a loader built every epoch) where the last one was
            # freed: one loader, whose epochs keep adding up (each one starts its workers)
            return
        self.dataloaders[id(loader)] = DataLoaderInfo(
            loader_id=id(loader),
            created_at=created_at,
            dataset=type(dataset).__name__,
            dataset_len=length,
            batch_size=loader.batch_size,
            num_workers=int(loader.num_workers),
            pin_memory=bool(loader.pin_memory),
            prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
            persistent_workers=bool(loader.persistent_workers),
            drop_last=bool(loader.drop_last),
            knobs_applied=applied,
        )

    def _wrap_loader_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        instrumentation = self

        def __iter__(loader: Any) -> Any:
            info = instrumentation.dataloaders.get(id(loader))
            start = time.perf_counter()
            iterator = original(loader)
            if info is not None:
                info.iterators_created += iterator.__dict__.pop("_diagnose_new", 0)
                iterator._diagnose_epoch_start = start
                # persistent workers: the same iterator again, its count of first batches restarts
                iterator.__dict__.pop("_diagnose_delivered", None)
                if info.batches_per_epoch is None:
                    info.batches_per_epoch = _length(loader)
            return iterator

        return __iter__

    def _wrap_iter_init(self, original: Callable[..., None]) -> Callable[..., None]:
        def __init__(iterator: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            with warnings_keep_their_origin():  # e.g. torch's "'pin_memory' ... no accelerator"
                original(iterator, loader, *args, **kwargs)
            iterator._diagnose_loader = id(loader)
            iterator._diagnose_new = 1  # a fresh iterator: with workers, fresh processes

        return __init__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        instrumentation = self
        clock = self.clock
        grad_enabled = torch.is_grad_enabled

        def __next__(iterator: Any) -> Any:
            clock.batch_requested()
            fetch_start = time.perf_counter()
            batch = original(iterator)
            clock.data_wait_s += time.perf_counter() - fetch_start
            clock.batch_delivered(leading_dim(batch))
            info = instrumentation.dataloaders.get(getattr(iterator, "_diagnose_loader", -1))
            if info is not None:
                started = iterator.__dict__.get("_diagnose_epoch_start")
                if started is not None:
                    # until each worker has delivered its first batch (round robin): the workers' start-up
                    delivered = iterator.__dict__.get("_diagnose_delivered", 0) + 1
                    now = time.perf_counter()
                    if delivered == 1:
                        info.first_batch_wait_s.append(now - started)
                        info.first_batch_at_s.append(started)
                        info.workers_ready_s.append(now - started)  # until a later worker delivers
                        iterator._diagnose_ready_index = len(info.workers_ready_s) - 1
                    else:
                        info.workers_ready_s[iterator._diagnose_ready_index] = now - started
                    if delivered >= info.num_workers:
                        del iterator.__dict__["_diagnose_epoch_start"]
                    else:
                        iterator._diagnose_delivered = delivered
                if instrumentation.in_window and grad_enabled():  # an eval loop (no_grad) is not the training data
                    info.fetches_in_window += 1
            return batch

        return __next__


def _length(loader: Any) -> int | None:
    """``len(loader)``, None where it has none (an iterable dataset) or it fails."""
    try:
        return len(loader)
    except Exception:  # noqa: BLE001 - a sampler without a length, an IterableDataset
        return None


def _dynamo_compiled_something() -> bool:
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return False
    counters = getattr(dynamo_utils, "counters", {})
    return bool(counters.get("stats", {}).get("unique_graphs", 0))


def describe_optimizer(optimizer: Any) -> OptimizerInfo:
    """Class, parameter tensors and the implementation (fused / foreach / for-loop) that
    ``optimizer.step()`` really uses, including torch's own default choice."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    defaults = getattr(optimizer, "defaults", {})
    if defaults.get("fused"):
        implementation = "fused"
    elif "foreach" not in defaults:
        implementation = "custom"  # not a torch.optim optimizer with a foreach option
    elif defaults["foreach"]:
        implementation = "foreach"
    elif defaults["foreach"] is False:
        implementation = "for-loop"
    else:
        implementation = _default_implementation(params, defaults)
    lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
    try:
        lr = float(lr) if lr is not None else None
    except (TypeError, ValueError):
        lr = None
    return OptimizerInfo(
        name=type(optimizer).__name__,
        param_tensors=len(params),
        params=sum(p.numel() for p in params),
        implementation=implementation,
        lr=lr,
    )


def _default_implementation(params: list[Any], defaults: dict[str, Any]) -> str:
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        fused, foreach = _default_to_fused_or_foreach(params, bool(defaults.get("differentiable")), use_fused=False)
    except Exception:  # noqa: BLE001 - a private helper: if torch changes it, fall back to torch's documented rule
        foreach = bool(params) and all(getattr(p, "is_cuda", False) for p in params)
        fused = False
    return "fused" if fused else "foreach" if foreach else "for-loop"


def describe_models() -> list[ModelInfo]:
    """The outermost modules alive in the process (found through the garbage collector)."""
    import gc

    import torch
    from torch import nn

    modules = []
    with warnings.catch_warnings():  # isinstance() wakes lazy torch objects that warn when touched
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, nn.Module):
                    modules.append(o)
            except ReferenceError:  # a dead weak proxy (torch.compile keeps some)
                continue
    children: set[int] = set()
    alive = []
    for m in modules:
        try:  # torch.compile keeps weak proxies of modules; skip the dead ones
            for c in m.children():
                children.add(id(c))
            orig = getattr(m, "_orig_mod", None)  # torch.compile's wrapper
        except ReferenceError:
            continue
        alive.append(m)
        if orig is not None:
            children.add(id(orig))
    compiled_cls = _optimized_module_class()
    out: list[ModelInfo] = []
    for m in alive:
        if id(m) in children:
            continue
        params = list(m.parameters())
        if not params:
            continue
        inner = getattr(m, "_orig_mod", m)
        convs = [x for x in inner.modules() if isinstance(x, nn.modules.conv._ConvNd)]
        channels_last = bool(convs) and all(
            c.weight.dim() == 4 and c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs
        )
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
        out.append(
            ModelInfo(
                name=type(inner).__name__,
                params=sum(p.numel() for p in params),
                param_dtype="/".join(dtypes),
                conv_layers=len(convs),
                channels_last=channels_last,
                compiled=(compiled_cls is not None and isinstance(m, compiled_cls))
                or getattr(m, "_compiled_call_impl", None) is not None
                or hasattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable"),
                data_parallel=isinstance(m, nn.DataParallel),
                distributed_data_parallel=isinstance(m, nn.parallel.DistributedDataParallel),
                parallel=_safe_parallel(m),
            )
        )
    out.sort(key=lambda info: -info.params)
    return out[:8]


def _safe_parallel(module: Any) -> dict[str, Any]:
    try:
        return describe_parallel(module)
    except Exception:  # noqa: BLE001 - a wrapper's internals differ across torch versions: say nothing
        return {}


def describe_parallel(module: Any) -> dict[str, Any]:
    """How the model is spread over devices, with the settings rules would advise (so that they
    do not advise what is set): nn.DataParallel's devices; DDP's bucket size; FSDP2
    (``fully_shard``): its sharded modules and how many of them have an explicit forward or
    backward prefetch (``set_modules_to_forward_prefetch`` / ``..._backward_prefetch``);
    FSDP1: its ``forward_prefetch`` and ``backward_prefetch``. Empty for a plain model."""
    from torch import nn

    inner = getattr(module, "_orig_mod", module)
    if isinstance(inner, nn.DataParallel):
        return {"kind": "DataParallel", "devices": len(inner.device_ids or [])}
    if isinstance(inner, nn.parallel.DistributedDataParallel):
        cap = getattr(inner, "bucket_bytes_cap", None)
        return {"kind": "DDP", "bucket_cap_mb": round(cap / 2**20, 3) if isinstance(cap, (int, float)) else None}
    fsdp1 = _fsdp1_settings(inner)
    if fsdp1:
        return fsdp1
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return {}
    sharded = [m for m in inner.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        return {}
    forward = backward = 0
    for m in sharded:
        state = m._get_fsdp_state()
        forward += bool(getattr(state, "_states_to_forward_prefetch", None))
        backward += bool(getattr(state, "_states_to_backward_prefetch", None))
    return {
        "kind": "FSDP2",
        "sharded_modules": len(sharded),
        "forward_prefetch_modules": forward,
        "backward_prefetch_modules": backward,
    }


def _fsdp1_settings(module: Any) -> dict[str, Any]:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return {}
    wrapped = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
    if not wrapped:
        return {}
    first = wrapped[0]
    backward = getattr(first, "backward_prefetch", None)
    return {
        "kind": "FSDP1",
        "sharded_modules": len(wrapped),
        "forward_prefetch": bool(getattr(first, "forward_prefetch", False)),
        "backward_prefetch": getattr(backward, "name", None) if backward is not None else None,
    }


def _optimized_module_class() -> type | None:
    module = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(module, "OptimizedModule", None) if module is not None else None

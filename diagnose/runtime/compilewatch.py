"""Observe torch.compile without changing it: which calls, in which mode, and what dynamo did.

``CompileWatch`` wraps ``torch.compile`` and ``nn.Module.compile``: each call is recorded (the
API, what was compiled, ``mode``/``backend``/``fullgraph``/``dynamic``, whether CUDA graphs are
on, the user's line) and passed on unchanged. At the end of the profiled window ``summary()``
reads dynamo's own bookkeeping (``torch._dynamo.utils.counters`` and its compilation metrics):
graph breaks with their reasons and the user lines where they happen, and the compilations that
happened after the warm-up (recompilations, with dynamo's reason for each).

The summary is JSON-ready; it becomes ``RunRecord.compile`` (see docs/report-schema.md).

With a ``knob_hook`` (``Knobs.script_compile``: ``diagnose verify``'s ``compile`` knob), the
script's own calls are where that knob takes effect: a call made from the script's code (its
direct caller is not library code: a framework's or torch's own compile is left alone) is given
the knob's mode, or returns the model eager for ``compile=off``. Two cases need care: a library
that wraps ``torch.compile`` itself after the watch (Lightning does, to remember the arguments)
stands between the script and the watch, so wrappers of the watch's own function are looked
through; and a framework that compiles the script's model again with the script's arguments
(``Fabric.setup`` re-applies ``torch.compile`` to the module it wraps) gets the knob too. What
is recorded is the call as it ran, with the knob's mode.
"""

from __future__ import annotations

import functools
import re
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from diagnose.runtime.usercode import source_line

#: resume functions dynamo makes after a graph break: ``torch_dynamo_resume_in_<function>_at_<line>``
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)$")
#: modes whose compiled graphs run as CUDA graphs (max-autotune turns them on too)
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def first_line(reason: str) -> str:
    """The headline of a dynamo reason (they run to a paragraph of hints and links), without the
    compile id that recompile reasons start with (``1/3: tensor 'x' size mismatch ...``)."""
    head = reason.strip().splitlines()[0].strip() if reason.strip() else reason
    return re.sub(r"^\d+/\d+: ", "", head)


def reason_kind(reason: str) -> str:
    """Reasons that differ only in numbers (sizes, values) are one kind of recompilation."""
    return re.sub(r"\d+", "N", reason)


def _target_name(model: Any) -> str:
    """The class of the module compiled (through a bound ``forward``), else the function's name."""
    model = getattr(model, "__self__", model)
    model = getattr(model, "_orig_mod", model)
    if hasattr(model, "parameters"):
        return type(model).__name__
    return getattr(model, "__qualname__", type(model).__name__)


#: ``(api, kwargs) -> kwargs`` to compile with, or None to leave the model eager
CompileKnobHook = Callable[[str, dict[str, Any]], "dict[str, Any] | None"]


class CompileWatch:
    """The wrappers and what they saw. One instance per run (the runner's hook registry).

    ``is_library(filename)`` says whether a caller's file is library code (torch, site-packages,
    diagnose): only the script's own calls reach ``knob_hook``."""

    def __init__(
        self,
        user_frame: Callable[[], str | None] | None = None,
        knob_hook: CompileKnobHook | None = None,
        is_library: Callable[[str], bool] | None = None,
    ) -> None:
        self.calls: list[dict[str, Any]] = []
        self._user_frame = user_frame or (lambda: None)
        self.knob_hook = knob_hook
        self._is_library = is_library or (lambda filename: False)
        self._undo: list[Callable[[], None]] = []
        self._inside_module_compile = False
        self._metrics_before: set[int] | None = None
        self._compile_wrapper: Any = None  # the watch's own torch.compile
        #: models whose compile the knob changed: a framework compiling one again gets it too
        self._knob_models: weakref.WeakSet[Any] = weakref.WeakSet()

    # --- install / remove ---------------------------------------------------------------------

    def install(self) -> None:
        import torch

        original_compile = torch.compile
        watch = self

        @functools.wraps(original_compile)
        def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
            from_script = watch._from_script(sys._getframe(1))
            if model is None:
                if from_script and not args:
                    # ``@torch.compile(mode=...)``: the knob applies to what it will decorate
                    return lambda fn: watch._compile_for_script("torch.compile", original_compile, fn, kwargs)
                return original_compile(model, *args, **kwargs)
            if watch._inside_module_compile:
                return original_compile(model, *args, **kwargs)
            if (from_script or watch._compiled_again(model)) and not args:
                return watch._compile_for_script("torch.compile", original_compile, model, kwargs)
            watch._record("torch.compile", model, kwargs)
            return original_compile(model, *args, **kwargs)

        torch.compile = compile
        self._compile_wrapper = compile
        self._undo.append(lambda: setattr(torch, "compile", original_compile))

        module_cls = torch.nn.Module
        if "compile" in vars(module_cls):
            original_method = vars(module_cls)["compile"]

            @functools.wraps(original_method)
            def module_compile(module: Any, *args: Any, **kwargs: Any) -> Any:
                if watch._from_script(sys._getframe(1)):
                    changed = watch.knob_hook("Module.compile", dict(kwargs))  # type: ignore[misc]
                    if changed is None:
                        return None  # compile=off: the module stays eager
                    kwargs = changed
                watch._record("Module.compile", module, kwargs)
                watch._inside_module_compile = True
                try:
                    return original_method(module, *args, **kwargs)
                finally:
                    watch._inside_module_compile = False

            module_cls.compile = module_compile  # type: ignore[method-assign, assignment]
            self._undo.append(lambda: setattr(module_cls, "compile", original_method))

    def _from_script(self, caller: Any) -> bool:
        """Whether a compile call is the script's own, for the knob to change (with a knob set):
        its caller, past any wrapper of the watch's ``torch.compile`` installed since, is not
        library code."""
        if self.knob_hook is None:
            return False
        import torch

        wrappers = set()
        outer = getattr(torch, "compile", None)
        while outer is not None and outer is not self._compile_wrapper:
            wrappers.add(getattr(outer, "__code__", None))
            outer = getattr(outer, "__wrapped__", None)
        if outer is None:  # the watch's function is not under torch.compile now: take the caller as it is
            wrappers.clear()
        while caller is not None and caller.f_code in wrappers:
            caller = caller.f_back
        return caller is not None and not self._is_library(caller.f_code.co_filename)

    def _compiled_again(self, model: Any) -> bool:
        """A framework compiling the script's model again, with the script's arguments (Fabric's
        ``setup``), directly or inside its strategy's wrapper (``.module``)."""
        if self.knob_hook is None or not self._knob_models:
            return False
        return any(self._is_knob_model(m) for m in (model, getattr(model, "module", None)) if m is not None)

    def _is_knob_model(self, model: Any) -> bool:
        try:
            return model in self._knob_models
        except TypeError:  # not weakly referenceable: never one of them
            return False

    def _compile_for_script(self, api: str, original: Callable[..., Any], model: Any, kwargs: dict[str, Any]) -> Any:
        changed = self.knob_hook(api, dict(kwargs))  # type: ignore[misc]
        if changed is None:
            return model  # compile=off: the script gets its model back, eager
        try:
            self._knob_models.add(model)
        except TypeError:  # a function or bound method that cannot be weakly referenced
            pass
        self._record(api, model, changed)
        return original(model, **changed)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _record(self, api: str, model: Any, kwargs: dict[str, Any]) -> None:
        mode = kwargs.get("mode") or "default"
        options = kwargs.get("options") or {}
        self.calls.append(
            {
                "api": api,
                "target": _target_name(model),
                "mode": mode,
                "backend": kwargs.get("backend")
                if isinstance(kwargs.get("backend"), str)
                else ("custom" if kwargs.get("backend") else "inductor"),
                "fullgraph": bool(kwargs.get("fullgraph", False)),
                "dynamic": kwargs.get("dynamic"),
                "cudagraphs": mode in CUDAGRAPH_MODES or bool(options.get("triton.cudagraphs")),
                "site": self._user_frame(),
            }
        )

    # --- the window -----------------------------------------------------------------------------

    def window_opened(self) -> None:
        """Remember which compilations happened during the warm-up."""
        self._metrics_before = {id(m) for m in _compilation_metrics()}

    def summary(self) -> dict[str, Any]:
        """What is known now: the calls, graph breaks, and compilations after the warm-up."""
        counters = _counters()
        stats = dict(counters.get("stats", {}))
        breaks = Counter({first_line(str(k)): v for k, v in counters.get("graph_break", {}).items()})
        metrics = _compilation_metrics()
        frames = [m for m in metrics if getattr(m, "co_name", None)]
        enabled = bool(self.calls) or bool(stats.get("unique_graphs"))
        if not enabled:
            return {}
        break_sites: Counter[str] = Counter()
        for m in frames:
            match = _RESUME.match(m.co_name or "")
            if match and m.co_filename:
                break_sites[f"{m.co_filename}:{match['line']}"] += 1
        recompiles: Counter[str] = Counter()
        example: dict[str, dict[str, str]] = {}
        after_warmup = 0
        if self._metrics_before is not None:
            for m in frames:
                if id(m) in self._metrics_before:
                    continue
                after_warmup += 1
                reason = getattr(m, "recompile_reason", None)
                text = first_line(reason) if reason else "first compilation of this frame"
                kind = reason_kind(text)
                recompiles[kind] += 1
                site = f"{m.co_filename}:{m.co_firstlineno}" if m.co_filename else ""
                example.setdefault(kind, {"reason": text, "site": site, "function": m.co_name})
        modes = sorted({c["mode"] for c in self.calls})
        return {
            "enabled": True,
            "calls": self.calls,
            "modes": modes,
            "cudagraphs": any(c["cudagraphs"] for c in self.calls),
            "graphs": int(stats.get("unique_graphs", 0)),
            "graph_breaks": [{"reason": r, "count": n} for r, n in breaks.most_common()],
            "graph_break_count": int(sum(breaks.values())),
            "graph_break_sites": [
                {"site": s, "count": n, "code": source_line(s)} for s, n in break_sites.most_common()
            ],
            "window_seen": self._metrics_before is not None,
            "compiles_after_warmup": after_warmup,
            "recompile_reasons": [dict(example[kind], count=n) for kind, n in recompiles.most_common()],
        }


def _counters() -> dict[str, Any]:
    utils = sys.modules.get("torch._dynamo.utils")
    return dict(getattr(utils, "counters", {})) if utils is not None else {}


def _compilation_metrics() -> list[Any]:
    utils = sys.modules.get("torch._dynamo.utils")
    get = getattr(utils, "get_compilation_metrics", None) if utils is not None else None
    try:
        return list(get()) if get is not None else []
    except Exception:  # noqa: BLE001 - a private API: if torch changes it, report what the counters say
        return []

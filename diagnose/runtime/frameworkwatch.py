"""The training framework a script's loop runs under, seen without importing it.

Lightning's ``Trainer``, Lightning ``Fabric``, the Hugging Face ``Trainer`` with its
``TrainingArguments``, and ``accelerate.Accelerator`` are watched where they are defined: a module that is already imported
is patched at once, one that the script imports later is patched right after it executes (an
import hook on ``sys.meta_path``). A framework the script does not use is never imported.

For each construction the watch records the framework, its version, the user's line that built
the object and the settings the advice depends on (``FrameworkInfo`` in the run record). The
same constructors are where ``diagnose verify``'s knobs take the framework's own switch
(``Trainer(precision="bf16-mixed")``, ``Fabric(precision="bf16-mixed")``,
``TrainingArguments(bf16=True)``, ``Accelerator(mixed_precision="bf16")``):
``knobs.Knobs.framework_changes`` says what to set.

Two more kinds of method are watched: ``Trainer.fit`` and ``Fabric.setup`` say where the user's
model is (``sites``, quoted in a finding's ``where``), and ``Fabric.backward`` is annotated as the
backward pass (``runtime/marks.py``): the precision plugin's and strategy's work around the
autograd engine is backward, not other host work.

Objects that one framework builds inside another's constructor (the ``Accelerator`` that the HF
``Trainer`` makes) are the outer framework's business: neither recorded nor changed.
"""

from __future__ import annotations

import importlib.abc
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from diagnose.record import FrameworkInfo
from diagnose.runtime.marks import backward_mark


@dataclass(frozen=True)
class Watched:
    """One method of one framework class whose calls are observed."""

    framework: str
    package: str  # the distribution's top-level module, for the version
    module: str  # the module that defines the class
    cls: str
    method: str  # "__init__", "__post_init__" (a dataclass: its fields are set), "fit", "setup", "backward"
    role: str  # "trainer", "arguments", "accelerator", "fabric" (constructions); "fit", "setup", "backward"


WATCHED = (
    Watched("lightning", "lightning", "lightning.pytorch.trainer.trainer", "Trainer", "__init__", "trainer"),
    Watched("lightning", "lightning", "lightning.pytorch.trainer.trainer", "Trainer", "fit", "fit"),
    Watched("lightning", "pytorch_lightning", "pytorch_lightning.trainer.trainer", "Trainer", "__init__", "trainer"),
    Watched("lightning", "pytorch_lightning", "pytorch_lightning.trainer.trainer", "Trainer", "fit", "fit"),
    Watched("fabric", "lightning", "lightning.fabric.fabric", "Fabric", "__init__", "fabric"),
    Watched("fabric", "lightning", "lightning.fabric.fabric", "Fabric", "setup", "setup"),
    Watched("fabric", "lightning", "lightning.fabric.fabric", "Fabric", "setup_module", "setup"),
    Watched("fabric", "lightning", "lightning.fabric.fabric", "Fabric", "backward", "backward"),
    Watched("fabric", "lightning_fabric", "lightning_fabric.fabric", "Fabric", "__init__", "fabric"),
    Watched("fabric", "lightning_fabric", "lightning_fabric.fabric", "Fabric", "setup", "setup"),
    Watched("fabric", "lightning_fabric", "lightning_fabric.fabric", "Fabric", "setup_module", "setup"),
    Watched("fabric", "lightning_fabric", "lightning_fabric.fabric", "Fabric", "backward", "backward"),
    Watched(
        "hf_trainer", "transformers", "transformers.training_args", "TrainingArguments", "__post_init__", "arguments"
    ),
    Watched("hf_trainer", "transformers", "transformers.trainer", "Trainer", "__init__", "trainer"),
    Watched("accelerate", "accelerate", "accelerate.accelerator", "Accelerator", "__init__", "accelerator"),
)

#: settings read off each constructed object (attribute names, or ``name=dotted.path`` where the
#: object keeps it deeper; missing ones are skipped)
SETTINGS: dict[tuple[str, str], tuple[str, ...]] = {
    ("lightning", "trainer"): ("precision", "accumulate_grad_batches", "max_steps", "max_epochs", "num_devices"),
    ("fabric", "fabric"): ("precision=strategy.precision.precision", "world_size"),
    ("hf_trainer", "arguments"): (
        "bf16",
        "fp16",
        "tf32",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "torch_compile",
        "torch_compile_mode",
        "optim",
        "use_cpu",
        "logging_steps",
        "max_steps",
        "num_train_epochs",
    ),
    ("hf_trainer", "trainer"): (),
    ("accelerate", "accelerator"): ("mixed_precision", "gradient_accumulation_steps", "device_placement"),
}

#: ``(framework, role, settings) -> the changes applied, by name``
KnobHook = Callable[[str, str, "_Settings"], dict[str, str]]


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a setting (enums and objects become their text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(getattr(value, "value", value))


def read_settings(framework: str, role: str, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in SETTINGS.get((framework, role), ()):
        name, _, path = entry.partition("=")
        try:
            value = obj
            for part in (path or name).split("."):
                value = getattr(value, part)
            out[name] = _plain(value)
        except Exception:  # noqa: BLE001 - a property that needs a later stage of set-up
            continue
    return out


def source_site(function: Any) -> str | None:
    """``file:line`` of a function's ``def`` (the user's ``training_step``)."""
    try:
        function = inspect.unwrap(function)
        lines = inspect.getsourcelines(function)
        return f"{inspect.getsourcefile(function)}:{lines[1]}"
    except (TypeError, OSError):
        return None


class FrameworkWatch:
    """Patches the watched classes (now, or when their module is imported) and records what the
    script builds. ``install``/``remove``; ``seen`` holds the records in construction order."""

    def __init__(
        self, user_site: Callable[[], str | None], knob_hook: KnobHook | None = None, library: tuple[str, ...] = ()
    ) -> None:
        self.user_site = user_site
        self.library = library
        self.knob_hook = knob_hook
        self.seen: list[FrameworkInfo] = []
        self._stack: list[str] = []  # frameworks whose constructors are running
        self._undo: list[Callable[[], None]] = []
        self._finder: _ImportHook | None = None
        self._patched: set[tuple[str, str, str]] = set()

    def install(self) -> None:
        by_module: dict[str, list[Watched]] = {}
        for w in WATCHED:
            by_module.setdefault(w.module, []).append(w)
        self._finder = when_imported({n: partial(self._patch_module, watched=ws) for n, ws in by_module.items()})

    def remove(self) -> None:
        stop_watching_imports(self._finder)
        self._finder = None
        while self._undo:
            self._undo.pop()()
        self._patched.clear()

    # --- patching -----------------------------------------------------------------------------

    def _patch_module(self, module: ModuleType, watched: list[Watched]) -> None:
        for w in watched:
            cls = getattr(module, w.cls, None)
            key = (w.module, w.cls, w.method)
            if cls is None or key in self._patched or w.method not in cls.__dict__:
                continue
            original = cls.__dict__[w.method]
            setattr(cls, w.method, backward_mark(original) if w.role == "backward" else self._wrap(w, original))
            self._patched.add(key)
            self._undo.append(partial(setattr, cls, w.method, original))

    def _wrap(self, w: Watched, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
            own = not watch._stack or watch._stack[-1] == w.framework
            if not own or w.role in ("fit", "setup"):
                if own and w.role == "fit":
                    watch._record_fit(w, args, kwargs)
                elif own:
                    watch._record_setup(w, args, kwargs)
                return original(obj, *args, **kwargs)
            applied: dict[str, str] = {}
            if watch.knob_hook is not None:
                args, kwargs, applied = watch._apply_knobs(w, original, obj, args, kwargs)
            watch._stack.append(w.framework)
            try:
                result = original(obj, *args, **kwargs)
            finally:
                watch._stack.pop()
            watch._record(w, obj, applied)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    def _apply_knobs(
        self, w: Watched, original: Callable[..., Any], obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, str]]:
        assert self.knob_hook is not None
        if w.method == "__post_init__":  # a dataclass: the fields are already attributes
            current = {name: getattr(obj, name) for name in vars(obj)}
            changes: dict[str, Any] = {}
            applied = self.knob_hook(w.framework, w.role, _Settings(current, changes))
            for name, value in changes.items():
                setattr(obj, name, value)
            return args, kwargs, applied
        try:
            bound = inspect.signature(original).bind_partial(obj, *args, **kwargs)
        except TypeError:
            return args, kwargs, {}
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(arguments)), None)  # self
        changes = {}
        applied = self.knob_hook(w.framework, w.role, _Settings(arguments, changes))
        if not changes:
            return args, kwargs, applied
        bound.arguments.update(changes)
        return tuple(bound.args[1:]), dict(bound.kwargs), applied

    # --- records ------------------------------------------------------------------------------

    def _record(self, w: Watched, obj: Any, applied: dict[str, str]) -> None:
        from diagnose.runtime.usercode import source_line

        package = sys.modules.get(w.package)
        site = self.user_site()
        self.seen.append(
            FrameworkInfo(
                framework=w.framework,
                role=w.role,
                cls=type(obj).__name__,
                version=str(getattr(package, "__version__", "")) or None,
                created_at=site,
                code=source_line(site) if site else "",
                settings=read_settings(w.framework, w.role, obj),
                knobs_applied=applied,
            )
        )

    def _record_fit(self, w: Watched, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Lightning's ``fit(model)``: where the user's ``training_step`` is."""
        model = kwargs.get("model", args[0] if args else None)
        step = getattr(type(model), "training_step", None) if model is not None else None
        site = source_site(step) if step is not None else None
        if site is not None and self.library and site.startswith(self.library):
            site = None  # Lightning's own default, not the user's code
        for info in reversed(self.seen):
            if info.framework == w.framework and info.role == "trainer":
                if site:
                    info.sites["training_step"] = site
                info.sites["fit"] = self.user_site() or ""
                info.settings["module"] = type(model).__name__ if model is not None else None
                break

    def _record_setup(self, w: Watched, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Fabric's ``setup(model, *optimizers)``: where the user hands over the model, and its class."""
        model = kwargs.get("module", args[0] if args else None)
        model = getattr(model, "_orig_mod", model)  # compiled before setup: name the user's class
        for info in reversed(self.seen):
            if info.framework == w.framework and info.role == "fabric":
                info.sites.setdefault("setup", self.user_site() or "")
                if model is not None:
                    info.settings.setdefault("module", type(model).__name__)
                break


class _Settings:
    """What a knob hook sees of one construction: the current values (``get``), and the
    changes it asks for (``set``)."""

    def __init__(self, current: dict[str, Any], changes: dict[str, Any]) -> None:
        self.current = current
        self.changes = changes

    def get(self, name: str, default: Any = None) -> Any:
        return self.changes.get(name, self.current.get(name, default))

    def set(self, name: str, value: Any) -> None:
        self.changes[name] = value


def when_imported(on_loaded: dict[str, Callable[[ModuleType], None]]) -> _ImportHook:
    """Call ``on_loaded[name](module)`` for each module already imported, now, and for the others
    right after the script imports them; returns the import hook (``stop_watching_imports``)."""
    for name, call in on_loaded.items():
        module = sys.modules.get(name)
        if module is not None:
            call(module)
    finder = _ImportHook(on_loaded)
    sys.meta_path.insert(0, finder)
    return finder


def stop_watching_imports(finder: _ImportHook | None) -> None:
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Calls ``on_loaded[name](module)`` right after a watched module executes."""

    def __init__(self, on_loaded: dict[str, Callable[[ModuleType], None]]) -> None:
        self.on_loaded = on_loaded
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.on_loaded or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self.on_loaded[fullname])
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, on_loaded: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.on_loaded = on_loaded

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            self.on_loaded(module)
        except Exception as exc:  # noqa: BLE001 - never break the script's import
            print(f"diagnose: warning: could not watch {module.__name__}: {exc}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self.inner, name)

"""Knobs: what-if changes applied to an unmodified script (``--set name=value``).

Each knob is one change a recommendation asks for, applied without editing the script:

=================== ==========================================================================
num_workers, pin_memory, prefetch_factor, persistent_workers, batch_size
                    DataLoader keyword values, replaced in ``DataLoader.__init__``
non_blocking        host-to-device copies of pinned tensors become ``non_blocking=True``
autocast            ``bf16`` or ``fp16``: autocast around forward and loss (off in backward)
tf32                TF32 matmuls and convolutions (``allow_tf32``)
cudnn_benchmark     ``torch.backends.cudnn.benchmark``
optimizer           ``fused`` or ``foreach`` for every torch.optim optimizer that supports it
compile             ``default``, ``reduce-overhead`` or ``max-autotune``: a script that compiles
                    its model itself has its own ``torch.compile(...)`` / ``Module.compile(...)``
                    calls run in that mode (``off``: they return the model eager); any other
                    script gets ``torch.compile`` of the forward of the first module it calls
channels_last       convolution models and their 4-d inputs in channels_last memory format
item_every          what-if for host syncs: ``.item()`` really syncs once every N calls per line
                    and returns the previous value otherwise (measurement only: values go stale)
pin_host            CPU tensors of at least ``PIN_MIN_BYTES`` sent to the GPU with ``.to()`` /
                    ``.cuda()`` from outside a DataLoader are pinned once (a cached pinned copy,
                    made again when the tensor changes in place) and copied ``non_blocking``
unsync              what-if for named sync sites (``FILE:LINE``, several joined by ``+``): the
                    site's ``.item()``, ``bool(t)`` / ``if t:``, ``.tolist()`` and ``nonzero``
                    block once, then return that first answer (changes the program's meaning:
                    measurement only)
bucket_cap_mb, gradient_as_bucket_view, static_graph
                    ``DistributedDataParallel`` keyword values, replaced in its ``__init__``
reshard_after_forward, forward_prefetch, backward_prefetch, param_dtype, reduce_dtype
                    FSDP: FSDP2's ``fully_shard`` keywords (``reduce_dtype`` and ``param_dtype``
                    replace those fields of its ``MixedPrecisionPolicy``; the prefetch knobs
                    make each sharded module prefetch the next N in forward and the previous N
                    in backward, ``set_modules_to_forward/backward_prefetch``), or FSDP1's
                    ``FullyShardedDataParallel`` keywords (``forward_prefetch``,
                    ``backward_prefetch``, ``MixedPrecision``)
backend             the process group's backend (``init_process_group(backend=...)``)
nproc_per_node      the ranks ``diagnose run`` launches through torchrun (the data-parallel
                    degree of a script that reads its world size from torchrun's variables;
                    1: one rank under torchrun, the reference of a scaling sweep)
=================== ==========================================================================

``env.NAME=value`` sets an environment variable before the script starts (a script that reads
its data-parallel degree, or any setting, from the environment), as ``arg.<flag>`` sets a flag.

Script arguments can be changed too (``arg.batch_size=64`` sets ``--batch_size 64``, spelled as
the script's argparse parser spells it: ``--batch-size 64`` where that is its option), which is
how sweeps drive a script's own flags; an option the parser lacks is said on stderr.

Under a training framework a knob takes the framework's own switch where it has one (the
framework's constructor is patched: ``runtime/frameworkwatch.py``): ``autocast`` becomes Lightning's
``Trainer(precision="bf16-mixed")`` or ``Fabric(precision="bf16-mixed")``, ``TrainingArguments(bf16=True)`` or
``Accelerator(mixed_precision="bf16")`` (the global autocast is then left); the DataLoader knobs,
``batch_size`` and ``compile`` become ``TrainingArguments`` fields under the HF Trainer (which
builds its DataLoaders and compiles the model from them); ``cudnn_benchmark`` becomes
``Trainer(benchmark=...)`` under Lightning (which would otherwise set the flag itself).
A script that compiles its model itself is its own switch for ``compile``
(``runtime/compilewatch.py`` hands its calls to ``Knobs.script_compile``): compiling the model a
second time around the script's compiled one would measure neither.
``Knobs.via()`` says which way each knob went; it is saved in ``run.json`` and shown by verify.

Why one module (about 930 lines): the knobs are one registry. ``KNOB_SPECS`` declares each (its
values, what it changes), and ``Knobs`` applies them to an unmodified script: the patches of
the DataLoader, the optimizers, autocast, compile, DDP/FSDP and the frameworks read the same
state (the values asked for, what the script built, the originals to restore), so that a knob
split out would reach into it. ``diagnose knobs`` lists the same table (``knob_rows``).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnose.errors import UsageError
from diagnose.record import DATALOADER_KNOBS, DataLoaderInfo  # declared there: the analysis reads them too

if TYPE_CHECKING:  # torch is imported where a knob is applied, not with this module
    import torch

#: how a knob's ``via`` starts when the knob reached nothing in the script: verify and sweep
#: then call the run "not applied", never a speedup (the run was the unchanged script)
NOT_APPLIED = "not applied"
#: host tensors smaller than this are not worth a pinned copy (the pinned copy costs a host memcpy)
PIN_MIN_BYTES = 1 << 20
#: the Tensor methods through which a script reads a GPU value on the host (``unsync``)
SYNC_METHODS = ("item", "__bool__", "tolist", "nonzero")
#: DistributedDataParallel's keywords a knob replaces
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
#: FSDP's settings (FSDP2's fully_shard, FSDP1's FullyShardedDataParallel)
FSDP_KNOBS = ("reshard_after_forward", "forward_prefetch", "backward_prefetch", "param_dtype", "reduce_dtype")
#: the launch's knobs: ``diagnose run`` reads them (not passed on to the ranks it launches)
LAUNCH_KNOBS = ("nproc_per_node",)
#: the modules of torch that export FSDP2's ``fully_shard`` (a script imports it from any)
FULLY_SHARD_MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed._composable.fsdp",
)


@dataclass(frozen=True)
class KnobSpec:
    name: str
    kind: str  # "int", "bool", "text" or a tuple of choices joined by "|"
    help: str


KNOB_SPECS: dict[str, KnobSpec] = {
    spec.name: spec
    for spec in (
        KnobSpec("num_workers", "int", "DataLoader num_workers"),
        KnobSpec("pin_memory", "bool", "DataLoader pin_memory"),
        KnobSpec("prefetch_factor", "int", "DataLoader prefetch_factor (with workers)"),
        KnobSpec("persistent_workers", "bool", "DataLoader persistent_workers (with workers)"),
        KnobSpec("batch_size", "int", "DataLoader batch_size"),
        KnobSpec("non_blocking", "bool", "pinned host-to-device copies become non_blocking"),
        KnobSpec("autocast", "bf16|fp16|off", "autocast around forward and loss"),
        KnobSpec("tf32", "bool", "TF32 for fp32 matmuls and convolutions"),
        KnobSpec("cudnn_benchmark", "bool", "torch.backends.cudnn.benchmark"),
        KnobSpec("optimizer", "fused|foreach|for-loop", "the optimizers' implementation"),
        KnobSpec(
            "compile",
            "default|reduce-overhead|max-autotune|off",
            "the mode of the script's own torch.compile calls (else: compile the first module called)",
        ),
        KnobSpec("channels_last", "bool", "channels_last model and inputs for convolutions"),
        KnobSpec(
            "item_every", "int", "what-if: .item() syncs once every N calls per line (stale values; measurement only)"
        ),
        KnobSpec(
            "pin_host", "bool", "pin host tensors sent to the GPU outside a DataLoader once; copy them non_blocking"
        ),
        KnobSpec(
            "unsync",
            "text",
            "what-if: the sync sites FILE:LINE[+FILE:LINE] (.item, bool(t), .tolist, nonzero) block once, then reuse that answer (changes meaning; measurement only)",
        ),
        KnobSpec(
            "bucket_cap_mb",
            "number",
            "DDP: DistributedDataParallel(bucket_cap_mb=...), the gradient bucket size in MiB",
        ),
        KnobSpec("gradient_as_bucket_view", "bool", "DDP: DistributedDataParallel(gradient_as_bucket_view=...)"),
        KnobSpec("static_graph", "bool", "DDP: DistributedDataParallel(static_graph=...)"),
        KnobSpec(
            "reshard_after_forward", "bool", "FSDP2: fully_shard(reshard_after_forward=...) for every sharded module"
        ),
        KnobSpec(
            "forward_prefetch",
            "int",
            "FSDP: all-gather the next N sharded modules ahead in forward (FSDP1: forward_prefetch=N>0)",
        ),
        KnobSpec(
            "backward_prefetch",
            "int",
            "FSDP: all-gather the previous N sharded modules ahead in backward (FSDP1: BACKWARD_PRE, 0: none)",
        ),
        KnobSpec(
            "param_dtype",
            "bf16|fp16|fp32",
            "FSDP: the mixed-precision policy's param_dtype (MixedPrecisionPolicy / MixedPrecision)",
        ),
        KnobSpec(
            "reduce_dtype", "bf16|fp16|fp32", "FSDP: the mixed-precision policy's reduce_dtype (gradient reduction)"
        ),
        KnobSpec("backend", "text", "the process group's backend: init_process_group(backend=...), e.g. nccl, gloo"),
        KnobSpec(
            "nproc_per_node",
            "int",
            "ranks launched through torchrun (diagnose run --nproc-per-node N): sweep it for the scaling",
        ),
    )
}


#: the largest whole-number knob value (a 32-bit C int: a DataLoader's batch size, its workers)
MAX_INT_KNOB = 2**31 - 1


def parse_value(spec: KnobSpec, raw: str) -> Any:
    raw = raw.strip()
    if spec.kind == "text":
        if not raw:
            raise UsageError(f"knob {spec.name} takes a value")
        return raw
    if spec.kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise UsageError(f"knob {spec.name} takes a number, not {raw!r}") from None
        if not number > 0 or number == float("inf"):
            raise UsageError(f"knob {spec.name} must be a positive number")
        return int(number) if number.is_integer() else number
    if spec.kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"knob {spec.name} takes a whole number, not {raw!r}") from None
        if value < 0:
            raise UsageError(f"knob {spec.name} must not be negative")
        if value > MAX_INT_KNOB:  # torch takes sizes and counts as C integers: the script would crash
            raise UsageError(f"knob {spec.name} takes at most {MAX_INT_KNOB:,}, not {raw}")
        return value
    if spec.kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"knob {spec.name} takes true or false, not {raw!r}")
    choices = spec.kind.split("|")
    if raw not in choices:
        raise UsageError(f"knob {spec.name} takes one of {', '.join(choices)}, not {raw!r}")
    return raw


def split_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--set takes name=value, not {text!r}", hint="diagnose knobs lists the names")
    return name.strip(), value


@dataclass
class Knobs:
    values: dict[str, Any] = field(default_factory=dict)
    script_args: dict[str, str] = field(default_factory=dict)
    #: ``env.NAME=value``: environment variables set before the script starts
    env: dict[str, str] = field(default_factory=dict)
    _undo: list[Callable[[], object]] = field(default_factory=list, repr=False)
    _compiled: bool = field(default=False, repr=False)
    #: the module whose ``forward`` the compile knob replaced (``maybe_compile``), if any
    _own_compiled: Any = field(default=None, repr=False)
    _autocast: Any = field(default=None, repr=False)
    #: knob -> the framework switch (or the script's own call) that carried it; the others
    #: went the global way
    _framework_via: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, assignments: list[str]) -> Knobs:
        knobs = cls()
        for text in assignments:
            name, raw = split_assignment(text)
            knobs.set(name, raw)
        return knobs

    def set(self, name: str, raw: str) -> None:
        if name.startswith("arg."):
            self.script_args[name[4:]] = raw
            return
        if name.startswith("env."):
            if not name[4:] or "=" in name[4:]:
                raise UsageError(f"env.NAME takes an environment variable's name, not {name!r}")
            self.env[name[4:]] = raw
            return
        spec = KNOB_SPECS.get(name)
        if spec is None:
            raise UsageError(
                f"unknown knob {name!r}",
                hint=f"knobs: {', '.join(KNOB_SPECS)}, or arg.<flag> for a script flag, env.<NAME> for a variable",
            )
        self.values[name] = parse_value(spec, raw)
        if name == "unsync":
            parse_sites(self.values[name])  # a malformed site is an error now, not at run time

    def __bool__(self) -> bool:
        return bool(self.values or self.script_args or self.env)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.values)
        out.update({f"arg.{k}": v for k, v in self.script_args.items()})
        out.update({f"env.{k}": v for k, v in self.env.items()})
        return out

    def nproc_per_node(self) -> int | None:
        """The ranks the ``nproc_per_node`` knob launches (None: the knob is not set)."""
        value = self.values.get("nproc_per_node")
        return None if value is None else int(value)

    # --- script arguments -----------------------------------------------------------------------

    def apply_to_args(self, args: list[str]) -> list[str]:
        """Set each ``arg.flag`` knob in the script's arguments: ``arg.flag=V`` makes it
        ``--flag V`` (replacing any value it had), ``arg.flag=flag`` a bare ``--flag``, and
        ``arg.flag=none`` removes it (``--set arg.mixed_precision=none,fp16,bf16``). A single
        value goes as ``--flag=V`` where the script's arguments are written so (``--key=value``:
        nanoGPT's configurator takes no other form) or hold no long option at all (argparse,
        click, absl and fire all read ``--flag=V``)."""
        out = list(args)
        joined = _joined_style(args)
        for flag, value in self.script_args.items():
            option = flag if flag.startswith("-") else f"--{flag}"
            out = _without_option(out, option)
            if value == "none":
                continue
            values = value.split()
            if value == "flag":
                out.append(option)
            elif joined and len(values) == 1 and option.startswith("--"):
                out.append(f"{option}={values[0]}")
            else:
                out += [option, *values]
        return out

    def script_options(self) -> list[str]:
        """The options the ``arg.`` knobs set (or remove), as ``apply_to_args`` spells them."""
        return [flag if flag.startswith("-") else f"--{flag}" for flag in self.script_args]

    def _patch_argparse(self) -> None:
        """Spell each ``arg.`` option as the script's own parser does: ``arg.batch_size`` is
        ``--batch-size`` for a parser that has that option (argparse is asked, at the moment the
        script parses); an option no parser has is said on stderr, since the script fails on it."""
        import argparse

        original = argparse.ArgumentParser.parse_known_args
        options = self.script_options()
        warned: set[str] = set()

        def parse_known_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
            given = sys.argv[1:] if args is None else list(args)
            known = [option for option in parser._option_string_actions if option.startswith("--")]
            respelled, unknown = respell_options(given, options, known)
            has_subcommands = any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)
            for option in unknown:
                given_here = any(a == option or a.startswith(option + "=") for a in respelled)
                if given_here and option not in warned and not has_subcommands:
                    warned.add(option)
                    print(
                        f"diagnose: warning: --set arg.{option.lstrip('-')}: the script's parser has no option {option}"
                        f" (its options: {', '.join(sorted(known)) or 'none'})",
                        file=sys.stderr,
                    )
            return original(parser, respelled, namespace)

        self._patch(argparse.ArgumentParser, "parse_known_args", parse_known_args)

    # --- DataLoader -----------------------------------------------------------------------------

    def apply_to_dataloader(
        self, original: Callable[..., None], loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        wanted = {k: v for k, v in self.values.items() if k in DATALOADER_KNOBS}
        if not wanted:
            return args, kwargs, {}
        bound = inspect.signature(original).bind(loader, *args, **kwargs)
        bound.apply_defaults()
        params = bound.arguments
        applied: dict[str, Any] = {}
        for name, value in wanted.items():
            if name == "batch_size" and params.get("batch_sampler") is not None:
                continue  # a batch sampler decides the batch size
            params[name] = value
            applied[name] = value
        if params.get("num_workers", 0) == 0:
            # these two are errors without workers
            params["prefetch_factor"] = None
            params["persistent_workers"] = False
        new_args = tuple(list(bound.args)[1:])
        return new_args, dict(bound.kwargs), applied

    # --- global knobs -----------------------------------------------------------------------------

    def install(self) -> None:
        import torch

        if self.script_args:
            self._patch_argparse()
        v = self.values
        if v.get("tf32") is not None:
            self._set_attr(torch.backends.cuda.matmul, "allow_tf32", bool(v["tf32"]))
            self._set_attr(torch.backends.cudnn, "allow_tf32", bool(v["tf32"]))
        if v.get("cudnn_benchmark") is not None:
            self._set_attr(torch.backends.cudnn, "benchmark", bool(v["cudnn_benchmark"]))
        if v.get("optimizer"):
            self._patch_optimizers(v["optimizer"])
        if v.get("non_blocking"):
            self._patch_to()
        if v.get("autocast") in ("bf16", "fp16"):
            self._enable_autocast(torch.bfloat16 if v["autocast"] == "bf16" else torch.float16)
        if v.get("channels_last"):
            self._patch_channels_last()
        if v.get("item_every", 0) > 1:
            self._patch_item(int(v["item_every"]))
        if v.get("pin_host"):
            self._patch_pin_host()
        if v.get("unsync"):
            self._patch_sync_sites(parse_sites(v["unsync"]))
        for name, value in self.env.items():
            self._set_env(name, value)
        if v.get("backend"):
            self._patch_backend(str(v["backend"]))
        if any(k in v for k in DDP_KNOBS):
            self._patch_ddp()
        if any(k in v for k in FSDP_KNOBS):
            self._patch_fsdp()

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _set_attr(self, owner: Any, name: str, value: Any) -> None:
        old = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        had = name in owner.__dict__
        old = owner.__dict__.get(name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, old) if had else delattr(owner, name))

    def _set_env(self, name: str, value: str) -> None:
        old = os.environ.get(name)
        os.environ[name] = value
        self._undo.append(lambda: os.environ.__setitem__(name, old) if old is not None else os.environ.pop(name, None))

    # --- distributed: the backend, DDP, FSDP ------------------------------------------------------

    def _patch_backend(self, backend: str) -> None:
        """``init_process_group(backend=...)`` takes the knob's backend, whatever the script passed."""
        import torch.distributed as dist

        original = dist.init_process_group
        params = inspect.signature(original).parameters

        def init_process_group(*a: Any, **kw: Any) -> Any:
            bound = inspect.signature(original).bind_partial(*a, **kw)
            bound.arguments["backend"] = backend
            self._framework_via["backend"] = f'init_process_group(backend="{backend}")'
            return original(*bound.args, **bound.kwargs)

        if "backend" in params:
            self._patch(dist, "init_process_group", init_process_group)
            self._patch(sys.modules["torch.distributed.distributed_c10d"], "init_process_group", init_process_group)

    def _patch_ddp(self) -> None:
        """``DistributedDataParallel(...)``'s keywords replaced by the DDP knobs (subclasses, such
        as the frameworks' wrappers, reach the patched ``__init__`` through ``super()``)."""
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        signature = inspect.signature(original)
        wanted = {k: self.values[k] for k in DDP_KNOBS if k in self.values and k in signature.parameters}

        def __init__(self_: Any, *a: Any, **kw: Any) -> None:
            bound = signature.bind(self_, *a, **kw)
            bound.arguments.update(wanted)
            for name, value in wanted.items():
                self._framework_via[name] = f"DistributedDataParallel({name}={value!r})"
            original(*bound.args, **bound.kwargs)

        self._patch(DistributedDataParallel, "__init__", __init__)

    def _patch_fsdp(self) -> None:
        """FSDP2's ``fully_shard`` (in every module that exports it) and FSDP1's
        ``FullyShardedDataParallel.__init__`` take the FSDP knobs."""
        import importlib

        original = None
        for name in FULLY_SHARD_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            fn = getattr(module, "fully_shard", None)
            if fn is None:
                continue
            original = original or fn
            if fn is original:
                self._patch(module, "fully_shard", self._fully_shard(original))
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel
        except ImportError:
            return
        self._patch_fsdp1(FullyShardedDataParallel)

    def _dtypes(self) -> dict[str, Any]:
        import torch

        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        return {k: dtypes[self.values[k]] for k in ("param_dtype", "reduce_dtype") if k in self.values}

    def _fully_shard(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``fully_shard`` with the knobs' keywords, and the prefetch chain: the sharded modules
        in the order the script shards them (a module that holds ones sharded before it, the
        root, is left out of the chain), each prefetching its next N in forward and its
        previous N in backward."""
        import dataclasses

        chain: list[Any] = []
        dtypes = self._dtypes()
        forward, backward = self.values.get("forward_prefetch"), self.values.get("backward_prefetch")

        def fully_shard(module: Any, *a: Any, **kw: Any) -> Any:
            changes = []
            if "reshard_after_forward" in self.values:
                kw["reshard_after_forward"] = bool(self.values["reshard_after_forward"])
                changes.append(f"reshard_after_forward={kw['reshard_after_forward']}")
            if dtypes:
                policy = kw.get("mp_policy")
                if policy is None:
                    from torch.distributed.fsdp import MixedPrecisionPolicy

                    policy = MixedPrecisionPolicy()
                kw["mp_policy"] = dataclasses.replace(policy, **dtypes)
                changes.append(
                    "mp_policy=MixedPrecisionPolicy(" + ", ".join(f"{k}={self.values[k]}" for k in dtypes) + ")"
                )
            result = original(module, *a, **kw)
            inner = {id(m) for m in module.modules()} if isinstance(module, _module_type()) else set()
            if (forward or backward) and inner and not any(id(m) in inner for m in chain):
                chain.append(module)
                j = len(chain) - 1
                if forward:
                    for i in range(max(0, j - forward), j):
                        chain[i].set_modules_to_forward_prefetch(chain[i + 1 : min(j, i + forward) + 1])
                if backward and j:
                    module.set_modules_to_backward_prefetch(chain[max(0, j - backward) : j][::-1])
            if forward:
                changes.append(f"set_modules_to_forward_prefetch(next {forward})")
            if backward:
                changes.append(f"set_modules_to_backward_prefetch(previous {backward})")
            for knob in FSDP_KNOBS:
                if knob in self.values:
                    self._framework_via[knob] = "fully_shard(" + ", ".join(changes) + ")"
            return result

        return fully_shard

    def _patch_fsdp1(self, cls: Any) -> None:
        import dataclasses

        from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision

        original = cls.__init__
        signature = inspect.signature(original)
        dtypes = self._dtypes()
        v = self.values

        def __init__(self_: Any, *a: Any, **kw: Any) -> None:
            bound = signature.bind(self_, *a, **kw)
            args = bound.arguments
            changes = []
            if "forward_prefetch" in v:
                args["forward_prefetch"] = v["forward_prefetch"] > 0
                changes.append(f"forward_prefetch={args['forward_prefetch']}")
            if "backward_prefetch" in v:
                args["backward_prefetch"] = BackwardPrefetch.BACKWARD_PRE if v["backward_prefetch"] > 0 else None
                changes.append(
                    f"backward_prefetch={'BackwardPrefetch.BACKWARD_PRE' if v['backward_prefetch'] > 0 else None}"
                )
            if dtypes:
                args["mixed_precision"] = dataclasses.replace(args.get("mixed_precision") or MixedPrecision(), **dtypes)
                changes.append("mixed_precision=MixedPrecision(" + ", ".join(f"{k}={v[k]}" for k in dtypes) + ")")
            for knob in FSDP_KNOBS:
                if knob in v:
                    self._framework_via[knob] = (
                        "FullyShardedDataParallel(" + ", ".join(changes) + ")"
                        if changes
                        else "FSDP1 has no such setting"
                    )
            original(*bound.args, **bound.kwargs)

        self._patch(cls, "__init__", __init__)

    def _patch_optimizers(self, implementation: str) -> None:
        import torch

        for cls in _optimizer_classes(torch.optim):
            params = inspect.signature(cls.__init__).parameters
            if "foreach" not in params:
                continue
            original = cls.__init__

            def __init__(self_: Any, *a: Any, __orig: Any = original, __params: Any = params, **kw: Any) -> None:
                if implementation == "fused" and "fused" in __params:
                    kw["fused"], kw["foreach"] = True, None
                elif implementation in ("foreach", "fused"):
                    kw["foreach"] = True
                    if "fused" in __params:
                        kw["fused"] = None
                else:
                    kw["foreach"] = False
                    if "fused" in __params:
                        kw["fused"] = None
                try:
                    __orig(self_, *a, **kw)
                except RuntimeError:
                    if not kw.get("fused"):
                        raise
                    kw["fused"], kw["foreach"] = None, True  # fused needs floating CUDA params
                    __orig(self_, *a, **kw)

            self._patch(cls, "__init__", __init__)

    def _patch_to(self) -> None:
        import torch

        original_to = torch.Tensor.to
        original_cuda = torch.Tensor.cuda

        def to(self_: Any, *a: Any, **kw: Any) -> Any:
            if "non_blocking" not in kw and self_.device.type == "cpu" and self_.is_pinned():
                kw["non_blocking"] = True
            return original_to(self_, *a, **kw)

        def cuda(self_: Any, *a: Any, **kw: Any) -> Any:
            if "non_blocking" not in kw and self_.is_pinned():
                kw["non_blocking"] = True
            return original_cuda(self_, *a, **kw)

        self._patch(torch.Tensor, "to", to)
        self._patch(torch.Tensor, "cuda", cuda)

    def _enable_autocast(self, dtype: Any) -> None:
        """Autocast from the start, paused around every backward (as torch recommends), with its
        weight-cast cache cleared there, so each step casts the updated weights."""
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self._autocast = torch.autocast(device_type=device, dtype=dtype)
        self._autocast.__enter__()
        self._undo.append(self._leave_autocast)
        original_backward = torch.autograd.backward

        def backward(*a: Any, **kw: Any) -> Any:
            torch.clear_autocast_cache()
            with torch.autocast(device_type=device, enabled=False):
                return original_backward(*a, **kw)

        self._patch(torch.autograd, "backward", backward)

    def _leave_autocast(self) -> None:
        if self._autocast is not None:
            self._autocast.__exit__(None, None, None)
            self._autocast = None

    # --- the frameworks' own switches -------------------------------------------------------------

    def framework_changes(self, framework: str, role: str, settings: Any) -> dict[str, str]:
        """Called by the framework watch as a framework object is built: set each knob this
        object has a switch for (``settings.set(name, value)``) and hand the knob over to it.
        Returns knob -> the change, as its user would write it."""
        import torch

        applied: dict[str, str] = {}
        for knob, value in self.values.items():
            change = framework_switch(knob, value, framework, role, torch.cuda.is_available())
            if change is None:
                continue
            for name, setting in change.items():
                settings.set(name, setting)
            text = f"{FRAMEWORK_CLASSES[(framework, role)]}({', '.join(f'{k}={v!r}' for k, v in change.items())})"
            applied[knob] = self._framework_via[knob] = text.replace("'", '"')
            if knob == "autocast":
                self._leave_autocast()  # the framework's own autocast replaces the global one
            elif knob == "compile":
                self._compiled = True  # the framework compiles the model itself
        return applied

    def via(self, loaders: Sequence[DataLoaderInfo] | None = None) -> dict[str, str]:
        """How each knob reached the script: the framework switch that carried it, else the
        global way (``GLOBAL_WAYS``). With ``loaders`` (the run's DataLoaders, after its
        profiled window), a DataLoader knob that went the global way but reached no loader that
        fed the profiled steps says ``not applied: ...`` (``dataloader_miss``)."""
        out = {knob: self._framework_via.get(knob, GLOBAL_WAYS.get(knob, "")) for knob in self.values}
        if loaders is not None:
            for knob in out:
                if knob in DATALOADER_KNOBS and knob not in self._framework_via:
                    out[knob] = dataloader_miss(knob, loaders) or out[knob]
        return out

    def _patch_channels_last(self) -> None:
        import torch
        from torch import nn

        original_call = nn.modules.conv._ConvNd.__call__

        def call(self_: Any, x: Any, *a: Any, **kw: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous(memory_format=torch.channels_last):
                x = x.contiguous(memory_format=torch.channels_last)
            if self_.weight.dim() == 4 and not self_.weight.is_contiguous(memory_format=torch.channels_last):
                with torch.no_grad():
                    self_.weight.data = self_.weight.data.contiguous(memory_format=torch.channels_last)
            return original_call(self_, x, *a, **kw)

        self._patch(nn.modules.conv._ConvNd, "__call__", call)

    def _patch_item(self, every: int) -> None:
        """Measure what removing per-step ``.item()`` syncs would buy: each call site syncs once
        every ``every`` calls and otherwise returns its previous value. The numbers a script
        prints become stale, so this is for measuring only, never for real training."""
        import sys

        import torch

        original_item = torch.Tensor.item
        last: dict[tuple[Any, int], tuple[int, Any]] = {}

        def item(self_: Any) -> Any:
            if self_.device.type == "cpu":
                return original_item(self_)
            frame = sys._getframe(1)
            site = (frame.f_code, frame.f_lineno)
            count, value = last.get(site, (0, None))
            if count % every == 0 or value is None:
                value = original_item(self_)
            last[site] = (count + 1, value)
            return value

        self._patch(torch.Tensor, "item", item)

    def _patch_pin_host(self, pin: Callable[[Any], Any] | None = None) -> None:
        """Copies of large pageable host tensors to the GPU, outside a DataLoader (pre-built
        batches, a data set kept in host memory), go from a pinned copy made once and reused,
        ``non_blocking``: the host no longer waits for each copy, and the copy overlaps kernels.

        The pinned copy is keyed by the tensor object (weakly: it dies with it) and made again
        when the tensor's version counter moved (an in-place change through torch). A write
        that torch does not see (through a numpy array sharing the memory) leaves the copy
        stale: a what-if for measuring, like the fix it stands for (pin once, reuse).
        ``pin`` makes the pinned copy (``Tensor.pin_memory``; a test passes its own).
        """
        import torch
        from torch.utils.weak import WeakIdKeyDictionary  # tensors compare by value: key them by identity

        pin = pin or (lambda t: t.pin_memory())
        original_to = torch.Tensor.to
        original_cuda = torch.Tensor.cuda
        pinned = WeakIdKeyDictionary()

        def source(self_: Any, target: Any) -> Any:
            """The pinned copy to send instead of ``self_``, or None to leave the call alone."""
            if target is None or torch.device(target).type == "cpu" or self_.device.type != "cpu":
                return None
            if self_.is_pinned() or self_.nbytes < PIN_MIN_BYTES or self_.requires_grad:
                return None
            cached = pinned.get(self_)
            if cached is None or cached[0] != self_._version:
                cached = (self_._version, pin(self_))
                pinned[self_] = cached
            return cached[1]

        def to(self_: Any, *a: Any, **kw: Any) -> Any:
            try:
                target = torch._C._nn._parse_to(*a, **kw)[0]
            except (TypeError, RuntimeError):
                target = None
            host = source(self_, target)
            if host is None:
                return original_to(self_, *a, **kw)
            kw["non_blocking"] = True
            a = tuple(x for x in a if not isinstance(x, bool))  # a positional non_blocking
            return original_to(host, *a, **kw)

        def cuda(self_: Any, device: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
            target = torch.device(
                "cuda" if device is None else device if not isinstance(device, int) else f"cuda:{device}"
            )
            host = source(self_, target)
            if host is None:
                return original_cuda(self_, device, non_blocking, **kw)
            return original_cuda(host, device, True, **kw)

        self._patch(torch.Tensor, "to", to)
        self._patch(torch.Tensor, "cuda", cuda)

    def _patch_sync_sites(
        self, sites: frozenset[tuple[str, int]], on_device: Callable[[Any], bool] | None = None
    ) -> None:
        """Measure what a sync site would cost if it did not block: at each named line, the first
        call of ``.item()``, ``bool(t)`` (``if t:``, ``if t.all():``), ``.tolist()`` or
        ``nonzero`` on a GPU tensor runs as usual; every later one returns that first answer
        without waiting for the GPU. This changes what the program computes (a check that never
        updates, a branch always taken the same way): for measuring only, never for training.
        ``on_device`` says which tensors block (not CPU ones; a test passes its own)."""
        import torch

        on_device = on_device or (lambda t: t.device.type != "cpu")

        answers: dict[tuple[str, Any, int], Any] = {}

        def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def method(self_: Any, *a: Any, **kw: Any) -> Any:
                if not on_device(self_):
                    return original(self_, *a, **kw)
                frame = sys._getframe(1)
                site = (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
                if site not in sites:
                    return original(self_, *a, **kw)
                key = (name, frame.f_code, frame.f_lineno)
                if key not in answers:
                    answers[key] = original(self_, *a, **kw)
                return answers[key]

            return method

        for name in SYNC_METHODS:
            self._patch(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))

    # --- torch.compile of the outermost module ------------------------------------------------------

    def compile_mode(self) -> str | None:
        mode = self.values.get("compile")
        return None if mode in (None, "off") else mode

    def compiles(self) -> bool:
        """Whether a run with these knobs compiles: the compile knob, or a script flag named
        like it that is passed (``arg.compile=flag``; ``none`` removes it)."""
        return self.compile_mode() is not None or any(
            "compile" in flag and value != "none" for flag, value in self.script_args.items()
        )

    def maybe_compile(self, module: Any) -> bool:
        """Compile the first module with parameters the script calls, once, by replacing its
        ``forward`` with ``torch.compile(forward)`` on the instance: the script keeps its own
        object, and its later calls run compiled (forward and, through AOTAutograd, backward).
        (``Module.compile()`` in place left the model eager on torch 2.13.)"""
        import torch

        mode = self.compile_mode()
        if mode is None or self._compiled:
            return False
        if not any(True for _ in module.parameters()):
            return False
        module.forward = torch.compile(module.forward, mode=None if mode == "default" else mode)
        self._compiled = True
        self._own_compiled = module
        return True

    def script_compile(self, api: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The script's own ``torch.compile(...)`` / ``Module.compile(...)`` call (``api``) under
        the compile knob: the keyword arguments to compile with (the knob's mode replaces the
        script's ``mode`` and ``options``, which torch refuses together), or None for
        ``compile=off`` (the model stays eager). Without the knob the call is left as it is.
        The knob's own wrapping (``maybe_compile``) is skipped from now on, and undone if it came
        first (a script that runs its model eagerly before compiling it)."""
        value = self.values.get("compile")
        if value is None:
            return kwargs
        self._compiled = True
        if self._own_compiled is not None:
            vars(self._own_compiled).pop("forward", None)  # the instance attribute maybe_compile set
            self._own_compiled = None
        self._framework_via.setdefault("compile", f"the script's {api}(...) call")
        if value == "off":
            return None
        changed = {k: v for k, v in kwargs.items() if k not in ("mode", "options")}
        if value != "default":
            changed["mode"] = value
        return changed


#: how a knob reaches a plain PyTorch script
GLOBAL_WAYS = {
    **{name: f"DataLoader({name}=...)" for name in DATALOADER_KNOBS},
    "non_blocking": "Tensor.to(non_blocking=True) for pinned tensors",
    "autocast": "global torch.autocast",
    "tf32": "torch.backends allow_tf32 flags",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark",
    "optimizer": "torch.optim constructor defaults",
    "compile": "torch.compile of the first module called",
    "channels_last": "channels_last convolution inputs and weights",
    "item_every": "Tensor.item() patched (measurement only)",
    "pin_host": "Tensor.to/cuda of large pageable host tensors from a cached pinned copy, non_blocking",
    "unsync": "Tensor.item/__bool__/tolist/nonzero patched at the named lines (measurement only)",
    # set when the script builds the object; still these words at the end: it never did
    **{name: f"{NOT_APPLIED}: the script built no DistributedDataParallel" for name in DDP_KNOBS},
    **{name: f"{NOT_APPLIED}: the script called no fully_shard / FullyShardedDataParallel" for name in FSDP_KNOBS},
    "backend": f"{NOT_APPLIED}: the script called no init_process_group",
    "nproc_per_node": "torchrun --nproc-per-node",
}


def dataloader_miss(knob: str, loaders: Sequence[DataLoaderInfo]) -> str | None:
    """``not applied: ...`` when the DataLoader knob ``knob`` reached no loader that delivered a
    batch to the profiled steps: a script that feeds its steps from its own loader, the knob set
    only on a loader built at start-up and never iterated in the loop (issue 32: ``batch_size``
    went to such a loader and the unchanged run was called 0.82x slower), or on none at all (a
    batch sampler decides the batch size). None when one that took it fed the steps."""
    took = [d for d in loaders if knob in d.knobs_applied]
    if any(d.fetches_in_window for d in took):
        return None
    if not took:
        return f"{NOT_APPLIED}: " + (
            "no DataLoader the script built took it" if loaders else "the script built no DataLoader"
        )
    sites = sorted({os.path.basename(d.created_at) for d in took if d.created_at})  # train.py:12
    where = f" ({', '.join(sites)})" if sites else ""
    return f"{NOT_APPLIED}: the DataLoader it reached{where} delivered no batch to the profiled steps"


#: the class a user writes each framework switch in
FRAMEWORK_CLASSES = {
    ("lightning", "trainer"): "Trainer",
    ("fabric", "fabric"): "Fabric",
    ("hf_trainer", "arguments"): "TrainingArguments",
    ("accelerate", "accelerator"): "Accelerator",
}

_LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "off": "32-true"}
_HF_DATALOADER = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "batch_size": "per_device_train_batch_size",
}


def framework_switch(knob: str, value: Any, framework: str, role: str, cuda: bool) -> dict[str, Any] | None:
    """The framework setting(s) that make ``knob=value`` for this framework object, or None
    when it has no switch for it (the knob then goes the global way)."""
    if (framework, role) == ("lightning", "trainer"):
        if knob == "autocast":
            return {"precision": _LIGHTNING_PRECISION[value]}
        if knob == "cudnn_benchmark":
            return {"benchmark": bool(value)}
    elif (framework, role) == ("fabric", "fabric"):
        # Fabric's precision plugin runs the forward of each model given to setup() in autocast
        # (and scales the loss in fabric.backward for fp16); compile goes through the script's own
        # torch.compile call (which setup() re-applies), the rest is the user's own objects
        if knob == "autocast":
            return {"precision": _LIGHTNING_PRECISION[value]}
    elif (framework, role) == ("hf_trainer", "arguments"):
        if knob == "autocast":
            change: dict[str, Any] = {"bf16": value == "bf16", "fp16": value == "fp16"}
            if value == "bf16" and not cuda:
                change["use_cpu"] = True  # TrainingArguments refuses bf16 without a GPU otherwise
            return change
        if knob in _HF_DATALOADER:
            return {_HF_DATALOADER[knob]: value}
        if knob == "compile":
            if value == "off":
                return {"torch_compile": False, "torch_compile_mode": None}
            return {"torch_compile": True, "torch_compile_mode": None if value == "default" else value}
    elif (framework, role) == ("accelerate", "accelerator"):  # noqa: SIM102 - a branch per framework, an if per knob
        if knob == "autocast":
            return {"mixed_precision": "no" if value == "off" else value}
    return None


def parse_sites(text: str) -> frozenset[tuple[str, int]]:
    """``train.py:40+model.py:12`` -> {("train.py", 40), ("model.py", 12)}: a file's base name and a line."""
    sites = set()
    for part in text.split("+"):
        name, sep, line = part.strip().rpartition(":")
        if not sep or not name or not line.isdigit():
            raise UsageError(
                f"unsync takes FILE:LINE sites joined by +, not {part!r}", hint="e.g. --set unsync=train.py:42"
            )
        sites.add((os.path.basename(name), int(line)))
    return frozenset(sites)


def option_key(option: str) -> str:
    """An option's name whatever its spelling: ``--batch-size``, ``--batch_size``, ``--Batch-Size``."""
    return option.lstrip("-").replace("-", "_").lower()


def respell_options(args: list[str], options: list[str], known: list[str]) -> tuple[list[str], list[str]]:
    """``args`` with each of ``options`` (set by ``arg.`` knobs) spelled as the one of ``known``
    (a parser's options) that names the same thing, its own occurrences removed first (the
    knob replaces them); and the options that no known option names."""
    out = list(args)
    unknown = []
    by_key: dict[str, list[str]] = {}
    for option in known:
        by_key.setdefault(option_key(option), []).append(option)
    for option in options:
        if option in known:
            continue
        matches = by_key.get(option_key(option), [])
        if len(matches) != 1:
            unknown.append(option)
            continue
        (spelled,) = matches
        out = _without_option(out, spelled)
        out = [
            spelled if a == option else f"{spelled}={a[len(option) + 1 :]}" if a.startswith(option + "=") else a
            for a in out
        ]
    return out, unknown


def _joined_style(args: list[str]) -> bool:
    """Whether the script's arguments give long options as ``--key=value``: some do, or none is
    a long option (then the joined form, which every parser of long options reads)."""
    long = [a for a in args if a.startswith("--") and len(a) > 2]
    return not long or any("=" in a for a in long)


def _without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and the values that follow it (``--opt v1 v2`` or ``--opt=v``)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == option:
            i += 1
            while i < len(args) and not (args[i].startswith("-") and not _is_number(args[i])):
                i += 1
            continue
        if not a.startswith(option + "="):
            out.append(a)
        i += 1
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _module_type() -> type[torch.nn.Module]:
    from torch import nn

    return nn.Module


def _optimizer_classes(optim_module: Any) -> list[type[torch.optim.Optimizer]]:
    import torch

    out: list[type[torch.optim.Optimizer]] = []
    for name in dir(optim_module):
        obj = getattr(optim_module, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer:
            out.append(obj)
    return out


#: the columns of ``diagnose knobs``
KNOBS_HEADERS = ("knob", "values", "what it changes")


def knob_rows() -> list[list[str]]:
    """The rows of ``diagnose knobs``: each knob, the values it takes, what it changes."""
    rows = [[spec.name, spec.kind.replace("|", " | "), spec.help] for spec in KNOB_SPECS.values()]
    rows.append(
        [
            "arg.<flag>",
            "text",
            "a flag of the script itself, e.g. arg.batch_size=64 (spelled as its argparse spells it)",
        ]
    )
    rows.append(["env.<NAME>", "text", "an environment variable set before the script starts, e.g. env.DP_SHARD=2"])
    return rows

"""The script's own command-line options that set how long it trains, and its batch.

Contract: ``ScriptArgs`` watches ``argparse.ArgumentParser.parse_known_args`` (``parse_args``
and the HF ``HfArgumentParser`` go through it) while the script runs; each parse of the script's
command line (``args=None``) records the options whose destination names a run length
(``--max_iters``, ``--epochs``, ``--num_train_epochs``, ...: ``record.LENGTH_OPTIONS``) with
their flag as the script spells it and the value it parsed. The runner sizes the window to the
steps those promise (``record.run_length``), and the report names the flag that gives more.

It also records the option that names the training batch (``batch_option``: ``--batch_size``,
``--batch-size``, ``--bs``, ``--train_batch_size``, ...; never an evaluation batch), where the
script's parsers have exactly one, with the gradient accumulation an option sets beside it
(``accumulation``: micro-batches an optimizer step): a script that builds its batches by hand
(no DataLoader) is counted in samples by them, and a larger batch reaches it as an ``arg.``
knob. A script that parses no command line with argparse (nanoGPT's configurator reads
``--key=value`` itself) is read from its ``--key=value`` arguments the same way, run-length
options included.

Installed after the knobs (``runner``), so that it wraps their respelling of ``arg.`` options
and reads the values the script really parsed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diagnose.record import LENGTH_OPTIONS, is_batch_dest


class ScriptArgs:
    def __init__(self) -> None:
        #: dest -> {"flag", "dest", "kind" ("steps" or "epochs"), "value"}
        self.options: dict[str, dict[str, Any]] = {}
        #: dest -> {"flag", "dest", "value"}: the options that name the training batch
        self.batches: dict[str, dict[str, Any]] = {}
        #: dest -> value: the options that set the gradient accumulation
        self.accumulations: dict[str, int] = {}
        #: an argparse parser read the script's command line
        self.parsed = False
        self._original: Any = None

    def install(self) -> None:
        original = argparse.ArgumentParser.__dict__["parse_known_args"]
        self._original = original
        watcher = self

        def parse_known_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
            result = original(parser, args, namespace)
            if args is None:  # the script's own command line, not a list it built
                watcher.parsed = True
                try:
                    watcher.saw(parser, result[0])
                except Exception:  # noqa: BLE001 - reading the options must never break the script's parse
                    pass
            return result

        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign, assignment]

    def remove(self) -> None:
        if self._original is not None:
            argparse.ArgumentParser.parse_known_args = self._original  # type: ignore[method-assign]
            self._original = None

    def saw(self, parser: argparse.ArgumentParser, namespace: Any) -> None:
        for action in parser._actions:
            flags = [f for f in action.option_strings if f.startswith("--")] or list(action.option_strings)
            value = getattr(namespace, action.dest, None)
            if not flags or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            kind = LENGTH_OPTIONS.get(action.dest.lower())
            if kind is not None:
                self.options[action.dest] = {"flag": flags[0], "dest": action.dest, "kind": kind, "value": value}
            elif is_batch_dest(action.dest) and isinstance(value, int) and value > 0:
                self.batches[action.dest] = {"flag": flags[0], "dest": action.dest, "value": value}
            elif is_accumulation_dest(action.dest) and isinstance(value, int) and value > 0:
                self.accumulations[action.dest] = value

    def found(self) -> list[dict[str, Any]]:
        """The run-length options; where no argparse parser read the command line, those of its
        ``--key=value`` arguments (nanoGPT's ``--max_iters=5000``)."""
        if not self.parsed and not self.options:
            return joined_lengths(sys.argv[1:])
        return list(self.options.values())

    def batch_option(self) -> dict[str, Any] | None:
        """The option that sets the training batch, as the script spelled and parsed it (with
        ``accumulation`` where one option set it); None where its parsers had none, or several
        (a micro and a global batch: which one a step holds cannot be told from the names).
        Where no argparse parser read the command line: its ``--key=value`` arguments."""
        batches, accumulations = self.batches, self.accumulations
        if not self.parsed and not batches:
            batches, accumulations = joined_options(sys.argv[1:])
        if len(batches) != 1:
            return None
        option = dict(next(iter(batches.values())))
        if len(accumulations) == 1:
            option["accumulation"] = next(iter(accumulations.values()))
        return option


def is_accumulation_dest(dest: str) -> bool:
    """Whether an option's destination sets the micro-batches an optimizer step accumulates
    (``gradient_accumulation_steps``, ``accumulation_steps``, ``grad_accum``)."""
    key = dest.lower().replace("-", "_")
    return "accum" in key and not key.startswith(("eval", "test", "val"))


def _joined_ints(args: list[str]) -> list[tuple[str, str, int]]:
    """(flag, dest, value) of each ``--key=N`` argument with N a positive integer."""
    out = []
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            continue
        flag, _, text = arg.partition("=")
        try:
            value = int(text)
        except ValueError:
            continue
        if value > 0:
            out.append((flag, flag[2:], value))
    return out


def joined_options(args: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The batch and accumulation options of arguments written ``--key=value`` (a script that
    reads its own command line), as ``ScriptArgs.saw`` keeps them from a parser."""
    batches: dict[str, dict[str, Any]] = {}
    accumulations: dict[str, int] = {}
    for flag, dest, value in _joined_ints(args):
        if is_batch_dest(dest):
            batches[dest] = {"flag": flag, "dest": dest, "value": value}
        elif is_accumulation_dest(dest):
            accumulations[dest] = value
    return batches, accumulations


def joined_lengths(args: list[str]) -> list[dict[str, Any]]:
    """The run-length options of arguments written ``--key=value``, as ``ScriptArgs.saw`` keeps
    them from a parser."""
    out = {}
    for flag, dest, value in _joined_ints(args):
        kind = LENGTH_OPTIONS.get(dest.lower())
        if kind is not None:
            out[dest] = {"flag": flag, "dest": dest, "kind": kind, "value": value, "joined": True}
    return list(out.values())

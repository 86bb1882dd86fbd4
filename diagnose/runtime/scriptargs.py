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

from diagnose.record import LENGTH_OPTIONS, is_accumulation_dest, is_batch_dest


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
            if flags:
                self.keep(flags[0], action.dest, getattr(namespace, action.dest, None))

    def keep(self, flag: str, dest: str, value: Any, joined: bool = False) -> None:
        """One option as the script parsed it, kept where it sets a run length (any number), the
        training batch or the gradient accumulation (a positive integer); ``joined``: read from
        a ``--key=value`` argument, and so said back."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        kind = LENGTH_OPTIONS.get(dest.lower())
        if kind is not None:
            self.options[dest] = {"flag": flag, "dest": dest, "kind": kind, "value": value}
            if joined:
                self.options[dest]["joined"] = True
        elif isinstance(value, int) and value > 0:
            if is_batch_dest(dest):
                self.batches[dest] = {"flag": flag, "dest": dest, "value": value}
            elif is_accumulation_dest(dest):
                self.accumulations[dest] = value

    def _read(self) -> ScriptArgs:
        """What the script parsed: its parsers' options; where no argparse parser read its
        command line, its ``--key=value`` arguments (nanoGPT's configurator reads them itself)."""
        if self.parsed or self.options or self.batches or self.accumulations:
            return self
        joined = ScriptArgs()
        for arg in sys.argv[1:]:
            flag, equals, text = arg.partition("=")
            if not flag.startswith("--") or not equals:
                continue
            try:
                value = int(text)
            except ValueError:
                continue
            if value > 0:
                joined.keep(flag, flag[2:], value, joined=True)
        return joined

    def found(self) -> list[dict[str, Any]]:
        """The run-length options (nanoGPT's ``--max_iters=5000`` too, ``_read``)."""
        return list(self._read().options.values())

    def batch_option(self) -> dict[str, Any] | None:
        """The option that sets the training batch, as the script spelled and parsed it (with
        ``accumulation`` where one option set it); None where its parsers had none, or several
        (a micro and a global batch: which one a step holds cannot be told from the names).
        Where no argparse parser read the command line: its ``--key=value`` arguments."""
        read = self._read()
        if len(read.batches) != 1:
            return None
        option = dict(next(iter(read.batches.values())))
        if len(read.accumulations) == 1:
            option["accumulation"] = next(iter(read.accumulations.values()))
        return option

"""The script's own command-line options that set how long it trains, and its batch.

Contract: ``ScriptArgs`` watches ``argparse.ArgumentParser.parse_known_args`` (``parse_args``
and the HF ``HfArgumentParser`` go through it) while the script runs; each parse of the script's
command line (``args=None``) records the options whose destination names a run length
(``--max_iters``, ``--epochs``, ``--num_train_epochs``, ...: ``record.LENGTH_OPTIONS``) with
their flag as the script spells it and the value it parsed. The runner sizes the window to the
steps those promise (``record.run_length``), and the report names the flag that gives more.

It also records the option that names the training batch (``batch_option``: ``--batch_size``,
``--batch-size``, ``--bs``, ``--train_batch_size``, ...; never an evaluation batch), where the
script's parsers have exactly one: a script that builds its batches by hand (no DataLoader) is
counted in samples by it, and a larger batch reaches it as an ``arg.`` knob.

Installed after the knobs (``runner``), so that it wraps their respelling of ``arg.`` options
and reads the values the script really parsed.
"""

from __future__ import annotations

import argparse
from typing import Any

from diagnose.record import LENGTH_OPTIONS, is_batch_dest


class ScriptArgs:
    def __init__(self) -> None:
        #: dest -> {"flag", "dest", "kind" ("steps" or "epochs"), "value"}
        self.options: dict[str, dict[str, Any]] = {}
        #: dest -> {"flag", "dest", "value"}: the options that name the training batch
        self.batches: dict[str, dict[str, Any]] = {}
        self._original: Any = None

    def install(self) -> None:
        original = argparse.ArgumentParser.__dict__["parse_known_args"]
        self._original = original
        watcher = self

        def parse_known_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
            result = original(parser, args, namespace)
            if args is None:  # the script's own command line, not a list it built
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

    def found(self) -> list[dict[str, Any]]:
        return list(self.options.values())

    def batch_option(self) -> dict[str, Any] | None:
        """The option that sets the training batch, as the script spelled and parsed it; None
        where its parsers had none, or several (a micro and a global batch: which one a step
        holds cannot be told from the names)."""
        return next(iter(self.batches.values())) if len(self.batches) == 1 else None

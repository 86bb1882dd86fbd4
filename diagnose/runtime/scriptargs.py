"""The script's own command-line options that set how long it trains.

Contract: ``ScriptArgs`` watches ``argparse.ArgumentParser.parse_known_args`` (``parse_args``
and the HF ``HfArgumentParser`` go through it) while the script runs; each parse of the script's
command line (``args=None``) records the options whose destination names a run length
(``--max_iters``, ``--epochs``, ``--num_train_epochs``, ...: ``record.LENGTH_OPTIONS``) with
their flag as the script spells it and the value it parsed. The runner sizes the window to the
steps those promise (``record.run_length``), and the report names the flag that gives more.
"""

from __future__ import annotations

import argparse
from typing import Any

from diagnose.record import LENGTH_OPTIONS


class ScriptArgs:
    def __init__(self) -> None:
        #: dest -> {"flag", "dest", "kind" ("steps" or "epochs"), "value"}
        self.options: dict[str, dict[str, Any]] = {}
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
            kind = LENGTH_OPTIONS.get(action.dest.lower())
            flags = [f for f in action.option_strings if f.startswith("--")] or list(action.option_strings)
            if kind is None or not flags:
                continue
            value = getattr(namespace, action.dest, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.options[action.dest] = {"flag": flags[0], "dest": action.dest, "kind": kind, "value": value}

    def found(self) -> list[dict[str, Any]]:
        return list(self.options.values())

"""Where diagnose's options end and the script's begin, for the commands that run a script
(``run``, ``verify``, ``sweep``).

Contract: ``split_command_line(args, options) -> ScriptCommandLine`` sorts the words after the
command name. Everything after the first ``--`` is the script's. Before it, a word that names an
option of the command (``--html``, ``--set num_workers=4``, ``--out=DIR``, ``-h``) is diagnose's,
wherever it stands, before or after the script; the first other word is the script, and the
words after it that diagnose does not know are the script's too (``diagnose run train.py
--batch-size 64`` keeps working). A word that looks like an option but is unknown, standing
before the script, is an error that says where the script's options go.
``ScriptCommand`` is the click command class that applies it before click parses; ``Command``
(every command) keeps Python types out of the help and ends every error of its command through
``errors.Failure`` (one line, a hint, the exit code: ``leave``), so that no command handles
errors itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import typer
import typer.core

from diagnose.errors import Failure, UsageError


@dataclass(frozen=True)
class OptionTable:
    """The option words of one command: those that take a value, and flags."""

    with_value: frozenset[str]
    flags: frozenset[str]

    @classmethod
    def of(cls, params: Sequence[Any]) -> OptionTable:
        """From click's parameters (duck-typed: typer may bring its own copy of click)."""
        with_value: set[str] = set()
        flags: set[str] = set()
        for param in params:
            if getattr(param, "param_type_name", None) != "option":
                continue
            names = [*param.opts, *param.secondary_opts]
            (flags if param.is_flag or param.count else with_value).update(names)
        return cls(frozenset(with_value), frozenset(flags))

    def takes(self, word: str) -> tuple[bool, bool]:
        """(known, its value is the next word)."""
        if word in self.flags:
            return True, False
        if word in self.with_value:
            return True, True
        name, eq, _ = word.partition("=")
        if eq and name in self.with_value and name.startswith("--"):
            return True, False
        short = word[:2]
        if not word.startswith("--") and len(word) > 2 and short in self.with_value:  # -oDIR
            return True, False
        return False, False


@dataclass
class ScriptCommandLine:
    """The command line sorted: diagnose's options, then the script and its arguments."""

    own: list[str] = field(default_factory=list)
    target: list[str] = field(default_factory=list)  # the script (if given), then its arguments
    unknown_before_script: str | None = None

    def as_args(self) -> list[str]:
        """What click parses: every option first, then ``--`` and the positional words."""
        return [*self.own, "--", *self.target] if self.target else list(self.own)


def split_command_line(args: Sequence[str], options: OptionTable) -> ScriptCommandLine:
    line = ScriptCommandLine()
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            line.target.extend(words[i + 1 :])
            break
        known, value_follows = options.takes(word)
        if known:
            line.own.append(word)
            if value_follows and i + 1 < len(words):
                line.own.append(words[i + 1])
                i += 1
        elif not line.target and word.startswith("-") and word != "-" and line.unknown_before_script is None:
            line.unknown_before_script = word
        else:
            line.target.append(word)
        i += 1
    return line


def _no_type(ctx: Any) -> None:  # the signature typer calls
    return None


class Command(typer.core.TyperCommand):
    """Every command of diagnose: its help names arguments by their metavar (SCRIPT, RUN_DIR)
    without typer's Python types (``<list[str]>``), which say nothing to a user."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "param_type_name", None) == "argument":
                param.display_type_rich = _no_type  # type: ignore[attr-defined]  # typer's arguments have it, click's Parameter does not

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer makes every context a typer.Context
        """The command; a ``DiagnoseError`` or memory running out ends it as ``errors.Failure``
        says (the one place errors become exit codes). Any other exception is a bug: raised."""
        try:
            return super().invoke(ctx)
        except (
            Exception
        ) as exc:  # only those Failure knows (a MemoryError's lines made beforehand); any other is raised again
            failure = Failure.of(exc)
            if failure is None:
                raise
        # left the except clause first: the traceback, and all that its frames held (a report
        # half rendered), are released before a line is written
        leave(failure)


def leave(failure: Failure) -> NoReturn:
    """Write the failure's lines on stderr and end the command with its exit code."""
    for line in failure.lines:
        typer.echo(line, err=True)
    raise typer.Exit(failure.exit_code)


class ScriptCommand(Command):
    """A command that runs a script: diagnose's options may stand before or after the script."""

    # typer makes every context a typer.Context (its context_class), narrower than click's
    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        return ["[OPTIONS]", "SCRIPT", "[OPTIONS]", "[-- SCRIPT_ARGS...]"]

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        line = split_command_line(args, OptionTable.of(self.get_params(ctx)))
        if line.unknown_before_script is not None and not ctx.resilient_parsing:
            # one line, as every error of diagnose (errors.py), not click's usage block
            error = UsageError(
                f"diagnose {ctx.info_name} has no option {line.unknown_before_script}; "
                f"the script's own options go after -- (diagnose {ctx.info_name} [OPTIONS] SCRIPT -- SCRIPT_ARGS)"
            )
            leave(Failure.of_error(error))
        return super().parse_args(ctx, line.as_args())

"""The terminal report as a terminal, a pipe and the environment ask for it: NO_COLOR,
FORCE_COLOR, COLUMNS, no hard wrap and no trailing spaces when piped."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.analysis.report import Report
from diagnose.renderers.terminal import ConsoleSettings, TerminalRenderer
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no real terminal")


@pytest.mark.parametrize(
    ("flag", "tty", "environ", "expected"),
    [
        (None, True, {}, True),
        (None, True, {"NO_COLOR": "1"}, False),  # issue 18: ignored on a terminal
        (None, False, {"FORCE_COLOR": "1"}, True),
        (None, False, {"FORCE_COLOR": "0"}, False),
        (None, True, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
        (True, True, {"NO_COLOR": "1"}, True),  # --color says so explicitly
        (False, True, {"FORCE_COLOR": "1"}, False),
        (None, False, {}, False),
    ],
)
def test_colour_follows_the_flag_then_no_color_then_force_color_then_the_terminal(flag, tty, environ, expected) -> None:
    stream = FakeTerminal() if tty else io.StringIO()
    assert ConsoleSettings.detect(flag, stream, environ).color is expected


def test_width_is_columns_else_the_terminals_and_none_when_piped() -> None:
    assert ConsoleSettings.detect(None, io.StringIO(), {"COLUMNS": "77"}).width == 77
    assert ConsoleSettings.detect(None, io.StringIO(), {}).width is None
    assert ConsoleSettings.detect(None, FakeTerminal(), {"COLUMNS": "120"}).width == 120


def report_lines(settings: ConsoleSettings) -> list[str]:
    report = Report.load(DATA / "data_bound" / "report.json")
    return TerminalRenderer.with_settings(settings).render(report).splitlines()


def test_piped_output_is_not_wrapped_and_has_no_trailing_spaces() -> None:
    lines = report_lines(ConsoleSettings(color=False, width=None))
    assert not [line for line in lines if line != line.rstrip()]
    (where,) = [line for line in lines if line.lstrip().startswith("where:")]
    assert len(where) > 200 and "(35% of the step)" in where  # one line, as long as it is


def test_columns_wraps_every_line_and_leaves_no_trailing_spaces() -> None:
    lines = report_lines(ConsoleSettings(color=False, width=72))
    # but a finding's code, kept whole to be copied (the terminal soft-wraps it)
    assert max(len(line) for line in lines if not line.startswith("    | ")) <= 72
    assert not [line for line in lines if line != line.rstrip()]


def test_the_command_honours_no_color_and_columns_through_a_pipe() -> None:
    def report(**environ: str) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
        env.update(PYTHONPATH=str(REPO), **environ)
        proc = subprocess.run(
            [sys.executable, "-m", "diagnose", "report", str(DATA / "data_bound")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout

    assert "\x1b[" in report(FORCE_COLOR="1") and "\x1b[" not in report(FORCE_COLOR="1", NO_COLOR="1")
    assert max(map(len, report(COLUMNS="90").splitlines())) <= 90
    assert max(map(len, report().splitlines())) > 200


def test_kernel_names_are_cut_to_fit_a_terminal() -> None:
    from diagnose.renderers.terminal import KERNEL_NAME_CHARS, short_kernel_name

    assert (
        short_kernel_name("void cudnn::engines::nchwToNhwcKernel<__nv_bfloat16, float>(params)")
        == "cudnn::engines::nchwToNhwcKernel<…>"
    )
    assert short_kernel_name("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"
    mangled = "_ZN17cutlass" + "x" * 500
    assert len(short_kernel_name(mangled)) == KERNEL_NAME_CHARS and short_kernel_name(mangled).endswith("…")

"""A third pass as a new user (issue 37): each fault found, as a user meets it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def diagnose(
    *args: str, cwd: Path, timeout: float = 300, env: dict | None = None, python_flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "diagnose", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- 1: -m looks the module up with the current folder on sys.path, as python -m does ----------


def test_module_is_looked_up_from_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    from diagnose.runtime.runner import resolve_target

    (tmp_path / "mypkg37").mkdir()
    (tmp_path / "mypkg37" / "__init__.py").write_text("")
    (tmp_path / "mypkg37" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    # the console script's sys.path: its own folder first, never the current one
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = list(sys.path)
    target = resolve_target(None, "mypkg37.train", [])
    assert (target.kind, target.value) == ("module", "mypkg37.train")
    assert sys.path == before
    sys.modules.pop("mypkg37", None)


@pytest.mark.slow
def test_run_dash_m_from_the_packages_folder_as_the_console_script_does(tmp_path: Path) -> None:
    from tests.scripts import MLP_TRAIN

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(MLP_TRAIN.lstrip())
    # python -P: no current folder on sys.path, as the installed `diagnose` script has none
    proc = diagnose(
        "run",
        "--warmup",
        "2",
        "--steps",
        "2",
        "--max-steps",
        "2",
        "--timed-steps",
        "2",
        "--no-lines",
        "-m",
        "mypkg.train",
        cwd=tmp_path,
        python_flags=("-P",),
    )
    assert proc.returncode == 0, proc.stderr


# --- 2: a --fail-on typo is an error, never a gate that cannot fail ------------------------------


DATA = REPO / "tests" / "data"


@pytest.mark.parametrize(
    ("condition", "message", "listed"),
    [
        ("NOPE001", "no rule has the rule id 'NOPE001'", "DATA001"),
        ("rule:DATA01X", "not a rule id", "DATA001"),
        ("category:dat", "no rule has the category 'dat' (did you mean data?)", "data, distributed"),
    ],
)
def test_fail_on_unknown_rule_or_category_is_a_usage_error(
    condition: str, message: str, listed: str, tmp_path: Path
) -> None:
    proc = diagnose(
        "analyze", str(DATA / "bare" / "data_bound.pt.trace.json.gz"), "--json", "--fail-on", condition, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert listed in proc.stderr
    assert proc.stdout == ""  # refused before any analysis


def test_fail_on_names_are_case_insensitive_and_trip_the_gate(tmp_path: Path) -> None:
    for condition in ("category:DATA", "data001"):
        proc = diagnose(
            "analyze",
            str(DATA / "bare" / "data_bound.pt.trace.json.gz"),
            "--json",
            "--fail-on",
            condition,
            cwd=tmp_path,
        )
        assert proc.returncode == 6, (condition, proc.stderr)
        assert "DATA001 fired" in proc.stderr


def test_fail_on_accepts_a_rule_of_the_users_own(tmp_path: Path) -> None:
    from diagnose.analysis.gate import parse_condition, resolve_names
    from diagnose.analysis.verdict.rules import load_rules
    from diagnose.errors import UsageError

    builtin = load_rules([])
    with pytest.raises(UsageError, match="MINE001"):
        resolve_names([parse_condition("MINE001")], builtin)

    class Mine:
        id = "MINE001"
        category = "mine"

    assert [
        c.value
        for c in resolve_names([parse_condition("mine001"), parse_condition("category:Mine")], [*builtin, Mine()])
    ] == ["MINE001", "mine"]


def test_docs_ci_lists_every_category_of_the_builtin_rules() -> None:
    from diagnose.analysis.verdict.rules import load_rules

    text = (REPO / "docs" / "ci.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| `category:data`")]
    assert {f"`{r.category}`" for r in load_rules([])} <= set(re.findall(r"`[a-z-]+`", row))


# --- 3: verify and sweep tables at 80 and 100 columns: columns dropped or stacked, nothing cut ---


WORD = re.compile(r"[^\s│┃|,;:()\[\]]+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text))


def uncut(narrow: str, wide: str, width: int) -> None:
    """Every line fits ``width``, and every word or number of the narrow rendering is one of the
    wide one's (a cut leaves a piece that is not: ``num_wo``, ``(389.9-2``)."""
    for line in narrow.splitlines():
        assert len(line) <= width, line
    notes = "\n".join(re.findall(r"\(not shown at \d+ columns: .*?shows\s+them\)", narrow, re.DOTALL))
    assert words(narrow) - words(notes) <= words(wide), sorted(words(narrow) - words(notes) - words(wide))


def _long_sweep():  # a Report
    from diagnose.experiments import Outcome
    from tests.test_experiment_display import sweep_report

    outcomes = [
        Outcome(
            f"arg.batch-size={b},num_workers={w}",
            {"arg.batch-size": str(b), "num_workers": str(w)},
            "ok",
            f"runs/s/{b}-{w}",
            steps_per_s=3.21,
            samples_per_s=389.93 + b,
            mean_step_ms=389.94 + w,
            p10_step_ms=212.35,
            p90_step_ms=1412.86,
            gpu_busy=0.42,
            peak_reserved_bytes=12_345_678_901,
            top_exposed={"category": "data_wait", "share": 0.61},
        )
        for b in (64, 128)
        for w in (0, 4)
    ]
    return sweep_report(outcomes)


@pytest.mark.parametrize("width", [80, 100])
def test_sweep_and_verify_tables_cut_no_label_or_number(width: int, tmp_path: Path) -> None:
    from diagnose.renderers.terminal import TerminalRenderer
    from tests.test_verify_table import _verified

    for report in (_long_sweep(), _verified(tmp_path)):
        narrow = TerminalRenderer(color=False, width=width).render(report)
        wide = TerminalRenderer(color=False, width=None).render(report)
        uncut(narrow, wide, width)
        for row in report.experiments.get("rows", []):
            assert row["label"] in narrow


def test_fit_table_drops_then_stacks() -> None:
    from rich.console import Console

    from diagnose.renderers.fit import Column, fit_table

    columns = [Column("run"), Column("speedup", "right"), Column("bound", "right", drop=0)]
    rows = [["num_workers=4", "1.23x", "2.50x"]]
    assert fit_table(columns, rows, 80).left_out == ()
    fitted = fit_table(columns, rows, 24)  # 13 + 2 + 7 fits, with bound's 7 more it does not
    assert fitted.left_out == ("bound",) and not fitted.stacked
    assert fitted.note(24) == "(not shown at 24 columns: bound; a wider terminal or --json shows them)"
    stacked = fit_table(columns, rows, 16)
    assert stacked.stacked
    console = Console(width=16, record=True, color_system=None)
    console.print(stacked.renderable)
    assert console.export_text().splitlines() == ["num_workers=4", "  speedup: 1.23x", "  bound: 2.50x"]


# --- 4 and issue 38 item 21: trim refuses what would lose a file, and writes whole or not at all --


TRACE = DATA / "bare" / "data_bound.pt.trace.json.gz"


def test_trim_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = diagnose("trim", str(TRACE), str(tmp_path / "no_such_dir" / "x.json"), cwd=tmp_path)
    assert proc.returncode == 5
    assert (
        proc.stderr.splitlines()[0]
        == f"diagnose: error: cannot write {tmp_path / 'no_such_dir' / 'x.json'}: the folder {tmp_path / 'no_such_dir'} does not exist"
    )
    assert "Traceback" not in proc.stderr


def test_trim_never_replaces_a_file_unasked_nor_its_own_input(tmp_path: Path) -> None:
    existing = tmp_path / "t.json"
    existing.write_text("mine")
    proc = diagnose("trim", str(TRACE), str(existing), cwd=tmp_path)
    assert proc.returncode == 5 and "already exists" in proc.stderr and "--overwrite" in proc.stderr
    assert existing.read_text() == "mine"
    proc = diagnose("trim", str(TRACE), str(existing), "--overwrite", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert existing.read_text().startswith("{")

    copy = tmp_path / "copy.pt.trace.json"
    copy.write_bytes(existing.read_bytes())
    for flags in ((), ("--overwrite",)):
        proc = diagnose("trim", str(copy), "copy.pt.trace.json", *flags, cwd=tmp_path)
        assert proc.returncode == 2 and "OUT is TRACE itself" in proc.stderr
        assert copy.read_bytes() == existing.read_bytes()


def test_trim_takes_a_run_directory_with_one_trace(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / TRACE.name).write_bytes(TRACE.read_bytes())
    proc = diagnose("trim", str(run), "small.pt.trace.json.gz", "--keep", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "small.pt.trace.json.gz").stat().st_size > 0
    (run / ("rank1_" + TRACE.name)).write_bytes(TRACE.read_bytes())
    proc = diagnose("trim", str(run), "two.json", cwd=tmp_path)
    assert proc.returncode == 2 and "holds 2 traces" in proc.stderr and not (tmp_path / "two.json").exists()


def test_a_full_file_system_leaves_the_old_file_and_no_piece(tmp_path: Path, monkeypatch) -> None:
    import builtins
    import errno

    from diagnose import atomic
    from diagnose.errors import OutputError
    from diagnose.rundir import write_file_whole

    target = tmp_path / "t.json"
    target.write_text("old")

    class FullDisk:  # a part lands, then the disk is full
        def __init__(self, path: Path) -> None:
            self.stream = builtins.open(path, "wb")  # noqa: SIM115 - the object's stream, closed by its close()

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.stream.close()

        def write(self, data: bytes) -> int:
            self.stream.write(data[:3])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "open", lambda path, mode: FullDisk(path), raising=False)
    with pytest.raises(OutputError, match=f"cannot write {target}: No space left on device"):
        write_file_whole(target, b"new content")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_trim_into_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        proc = diagnose("trim", str(TRACE), str(folder / "x.json"), cwd=tmp_path)
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 5 and "is not writable" in proc.stderr and "Traceback" not in proc.stderr
    assert list(folder.iterdir()) == []


# --- 5: a finding wraps inside its indent; its code is never wrapped out of the gutter ----------


def test_a_finding_wraps_inside_its_indent_and_keeps_its_code_whole() -> None:
    from diagnose.api import analyze
    from diagnose.renderers.terminal import TerminalRenderer

    report = analyze(TRACE)
    (finding,) = [f for f in report.findings if f["rule"] == "DATA001"]
    text = TerminalRenderer(color=False, width=60).render(report)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(" 1. DATA001"))
    end = lines.index("", first)
    block = lines[first + 1 : end]
    assert block and all(line.startswith("    ") for line in block), block
    code = [line for line in block if line.startswith("    | ")]
    assert code == [f"    | {line}".rstrip() for line in finding["do"].splitlines()]


# --- 6: a usage error leaves no run directory behind ----------------------------------------------


@pytest.mark.parametrize("command", ["run", "verify", "sweep"])
@pytest.mark.parametrize(
    "target", [[], ["missing.py"], ["folder"], ["/bin/ls"], ["-m", "no_such_mod37"], ["train.py", "--set", "nosuch=1"]]
)
def test_a_usage_error_leaves_no_run_directory(command: str, target: list[str], tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "train.py").write_text("print('never run')\n")
    sweep = ["--set", "num_workers=0,2"] if command == "sweep" and "--set" not in target else []
    if command == "sweep" and "--set" in target:
        target = ["train.py", "--set", "num_workers=0,2", "--with", "nosuch=1"]
    proc = diagnose(command, *sweep, *target, "--out", "out", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("diagnose: error:") and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "train.py"]


# --- 7: --set arg.NAME is spelled as the script's own parser spells it ---------------------------


def test_respell_options_asks_the_parsers_spelling() -> None:
    from diagnose.runtime.knobs import respell_options

    known = ["--batch-size", "--lr", "--help", "--mixed-precision"]
    args = ["--batch-size", "64", "--lr=0.1", "--batch_size", "128", "--mixed_precision=bf16"]
    assert respell_options(args, ["--batch_size", "--mixed_precision", "--lr", "--nosuch"], known) == (
        ["--lr=0.1", "--batch-size", "128", "--mixed-precision=bf16"],
        ["--nosuch"],
    )


def test_arg_knob_reaches_a_dashed_option_and_an_unknown_one_is_said(tmp_path: Path) -> None:
    from tests.scripts import MLP_TRAIN

    (tmp_path / "train.py").write_text(MLP_TRAIN.lstrip())
    fast = ["--warmup", "2", "--steps", "2", "--max-steps", "2", "--timed-steps", "2", "--no-lines"]
    proc = diagnose(
        "run", *fast, "--json", "--set", "arg.batch_size=24", "train.py", "--", "--batch-size", "64", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    import json

    report = json.loads(proc.stdout)
    assert report["throughput"]["batch_size"] == 24
    proc = diagnose("run", *fast, "--json", "--set", "arg.batch_sise=24", "train.py", cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "diagnose: warning: --set arg.batch_sise: the script's parser has no option --batch_sise (its options: --batch-size, --epochs, --help)"
        in proc.stderr
    )


# --- 8: TERM=dumb, the sweep's status colour, a child run's progress, Kineto's own lines ----------


class _Terminal:
    """A stream that says it is a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no descriptor")

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_term_dumb_gets_no_colour_nor_escape_codes(monkeypatch) -> None:
    from diagnose.progress import Progress
    from diagnose.renderers.terminal import ConsoleSettings

    assert ConsoleSettings.detect(None, _Terminal(), {"TERM": "xterm-256color"}).color
    assert not ConsoleSettings.detect(None, _Terminal(), {"TERM": "dumb"}).color
    assert ConsoleSettings.detect(True, _Terminal(), {"TERM": "dumb"}).color  # --color still wins
    assert ConsoleSettings.detect(None, _Terminal(), {"TERM": "dumb", "FORCE_COLOR": "1"}).color
    monkeypatch.setenv("TERM", "dumb")
    stream = _Terminal()
    progress = Progress(stream)
    progress.step("step 3")
    assert stream.text == ""


def test_a_sweep_that_ran_has_a_green_status_line() -> None:
    from diagnose.renderers.terminal import TerminalRenderer

    report = _long_sweep()
    report.status["exit_code"] = 0
    text = TerminalRenderer(color=True, width=None).render(report)
    (line,) = [line for line in text.splitlines() if "4 runs of data_bound.py" in line]
    assert "\x1b[32m" in line and "\x1b[31m" not in line  # green, not red
    report.status["exit_code"] = 1  # no point ran
    text = TerminalRenderer(color=True, width=None).render(report)
    (line,) = [line for line in text.splitlines() if "4 runs of data_bound.py" in line]
    assert "\x1b[31m" in line


def test_kineto_lines_are_kept_off_stderr_and_the_rest_kept() -> None:
    from diagnose.runtime.kinetolog import kept_lines

    raw = (
        b"USDT:2026-11-27 05:01:21 28288:28288 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        b"my own warning\n"
        b"STAGE:2026-11-27 05:02:17 30039:30039 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n"
    )
    assert kept_lines(raw) == b"my own warning\n"


def test_torchs_spurious_profiler_warning_is_ignored_around_the_profiler_and_no_other() -> None:
    """torch 2.11 warns "Profiler clears events at the end of each cycle" at diagnose's one-cycle
    schedule (on every GPU run's terminal, -q or not); any other warning still reaches the user."""
    import warnings

    from diagnose.runtime.kinetolog import without_kineto_lines

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with without_kineto_lines():
            warnings.warn(
                "Warning: Profiler clears events at the end of each cycle.Only events from the current cycle "
                "will be reported.To keep events across cycles, set acc_events=True.",
                UserWarning,
                stacklevel=1,
            )
            warnings.warn("the script's own warning", UserWarning, stacklevel=1)
        warnings.warn("Warning: Profiler clears events at the end of each cycle.", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "the script's own warning",
        "Warning: Profiler clears events at the end of each cycle.",  # outside diagnose's calls: the script's
    ]


def test_a_child_runs_progress_reaches_the_parent_and_no_kineto_line_shows(tmp_path: Path) -> None:
    from diagnose.experiments import Spec, run_experiment
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from tests.scripts import MLP_TRAIN

    (tmp_path / "train.py").write_text(MLP_TRAIN.lstrip())
    lines: list[str] = []
    plan = WindowPlan(warmup=2, steps=2, timed=2, max_steps=2)
    out = RunDir.create(tmp_path / "child")
    outcome = run_experiment(
        [str(tmp_path / "train.py"), "--"], Spec("baseline"), out, plan, timeout=240, on_child_line=lines.append
    )
    assert outcome.status == "ok", outcome.error
    assert any("warm" in line for line in lines) and any("profil" in line for line in lines), lines
    proc = diagnose(
        "run", "--warmup", "2", "--steps", "2", "--max-steps", "2", "--timed-steps", "2", "-q", "train.py", cwd=tmp_path
    )
    assert proc.returncode == 0 and "USDT:" not in proc.stderr and "STAGE:" not in proc.stderr, proc.stderr


# --- 9: compare knows each run's spread and notes, one window for all, and warns of unlike runs ---


def _saved(name: str = "data_bound"):  # a Report
    from diagnose.api import analyze

    return analyze(DATA / name, reanalyze=True)


def _scaled(report, factor: float):  # Report in and out
    """The report with its steady throughput ``factor`` times higher (and its step shorter)."""
    import copy

    other = copy.deepcopy(report)
    steady = other.throughput["steady"]
    for key in ("steps_per_s", "samples_per_s"):
        steady[key] = steady[key] * factor
    for key in ("mean_step_ms", "p10_step_ms", "p90_step_ms", "median_step_ms"):
        if key in steady:
            steady[key] = steady[key] / factor
    return other


def test_a_change_inside_the_runs_spread_is_said_to_be_no_measurable_change() -> None:
    from diagnose.analysis.compare import compare_reports

    base = _saved()
    steady = base.throughput["steady"]
    assert steady.get("p10_step_ms") and steady.get("p90_step_ms")
    spread = (steady["p90_step_ms"] - steady["p10_step_ms"]) / 2 / steady["mean_step_ms"]
    inside = compare_reports([("a", base), ("b", _scaled(base, 1 + spread / 2))])
    assert inside.runs[1].inside_spread
    assert f"inside the runs' spread of ±{round(spread * 100)}%: no measurable change" in inside.runs[1].shift
    outside = compare_reports([("a", base), ("b", _scaled(base, 1 + spread * 3))])
    assert not outside.runs[1].inside_spread and "no measurable change" not in outside.runs[1].shift
    assert inside.runs[0].spread == round(spread, 4)
    assert inside.runs[0].notes == tuple(w for w in base.warnings if w.startswith("profiling made"))


def test_compare_uses_one_window_for_every_run() -> None:
    import copy

    from diagnose.analysis.compare import compare_reports

    base = _saved()
    unprofiled = copy.deepcopy(base)
    unprofiled.throughput["steady"] = None  # ended before its timed window: only the profiled figure
    comparison = compare_reports([("a", base), ("b", unprofiled)])
    assert comparison.window == "profiled"
    assert comparison.runs[1].speedup == 1.0  # the same profiled figure, not steady against profiled


def test_compare_warns_when_the_runs_are_of_different_scripts_or_plans() -> None:
    import copy

    from diagnose.analysis.compare import compare_reports

    base = _saved()
    other = copy.deepcopy(base)
    other.run["target"] = {**other.run["target"], "value": "/w/other.py"}
    other.run["plan"] = {**other.run["plan"], "steps": 9}
    warnings = compare_reports([("a", base), ("b", other)]).warnings
    assert warnings[0].startswith("the runs are of different scripts: a: ") and warnings[0].endswith("b: /w/other.py")
    assert warnings[1].startswith("the runs are of different window plans")
    assert compare_reports([("a", base), ("b", copy.deepcopy(base))]).warnings == ()


def test_compare_labels_report_json_paths_by_their_run_folder(tmp_path: Path) -> None:
    import shutil

    for name in ("before", "after"):
        shutil.copytree(DATA / "data_bound", tmp_path / name)
    from diagnose.api import compare

    reports = [
        tmp_path / name / "diagnose" / "report.json"
        if (tmp_path / name / "diagnose").is_dir()
        else tmp_path / name / "report.json"
        for name in ("before", "after")
    ]
    assert compare(*reports).labels == ("before", "after")
    proc = diagnose("compare", *map(str, reports), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json

    assert [run["label"] for run in json.loads(proc.stdout)["runs"]] == ["before", "after"]


# --- 11: a run's report.json is taken wherever a run directory is ------------------------------------


def test_report_and_analyze_take_a_runs_report_json(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(DATA / "data_bound", tmp_path / "run")
    own = tmp_path / "run" / "diagnose" / "report.json"
    path = own if own.is_file() else tmp_path / "run" / "report.json"
    for command in (["report"], ["analyze"], ["report", "--html"]):
        proc = (
            diagnose(*command, str(path), "--no-color", cwd=tmp_path)
            if command != ["report", "--html"]
            else diagnose(*command, str(path), cwd=tmp_path)
        )
        assert proc.returncode == 0, (command, proc.stderr)
    assert (tmp_path / "run" / "report.html").is_file()


# --- 12: every command that writes report.html says where -----------------------------------------


def test_every_html_writer_says_where_report_html_went(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(DATA / "data_bound", tmp_path / "run")
    proc = diagnose("analyze", str(TRACE), "--html", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (html,) = (tmp_path / "runs").glob("analyze-data_bound-*/report.html")
    assert f"wrote {html}" in proc.stderr.splitlines()
    proc = diagnose("analyze", str(tmp_path / "run"), "--html", "--json", cwd=tmp_path)
    assert f"wrote {tmp_path / 'run' / 'report.html'}" in proc.stderr.splitlines()
    from tests.scripts import MLP_TRAIN

    (tmp_path / "train.py").write_text(MLP_TRAIN.lstrip())
    proc = diagnose(
        "run",
        "--warmup",
        "2",
        "--steps",
        "2",
        "--max-steps",
        "2",
        "--timed-steps",
        "2",
        "--html",
        "--out",
        "r",
        "--no-lines",
        "train.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {tmp_path / 'r' / 'report.html'}" in proc.stderr.splitlines()


def test_docs_say_where_a_bare_traces_html_goes() -> None:
    text = (REPO / "docs" / "html-report.md").read_text()
    assert "beside it" not in text.split("```")[1] and "runs/analyze-" in text


# --- 13: shell completion, -q everywhere, one meaning of --steps, listings at COLUMNS --------------


def as_console_script(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """``diagnose ARGS`` as the console script runs it (its name is diagnose, not python -m ...)."""
    code = "import sys; sys.argv[0] = 'diagnose'; from diagnose.cli import main; main()"
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("shell", "marker"), [("bash", "_DIAGNOSE_COMPLETE=complete_bash"), ("zsh", "_DIAGNOSE_COMPLETE=complete_zsh")]
)
def test_shell_completion_scripts_and_install(shell: str, marker: str, tmp_path: Path) -> None:
    proc = as_console_script(
        "--show-completion", shell, cwd=tmp_path, env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    )
    assert proc.returncode == 0, proc.stderr
    assert marker in proc.stdout
    proc = as_console_script(
        "--install-completion",
        shell,
        cwd=tmp_path,
        env={"HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    rc = tmp_path / (".bashrc" if shell == "bash" else ".zshrc")
    assert rc.is_file() and rc.read_text().strip()


def test_bash_completes_commands_and_options(tmp_path: Path) -> None:
    proc = as_console_script(
        cwd=tmp_path, env={"_DIAGNOSE_COMPLETE": "complete_bash", "COMP_WORDS": "diagnose ana", "COMP_CWORD": "1"}
    )
    assert proc.stdout.split() == ["analyze"]
    proc = as_console_script(
        cwd=tmp_path,
        env={"_DIAGNOSE_COMPLETE": "complete_bash", "COMP_WORDS": "diagnose run train.py --warm", "COMP_CWORD": "3"},
    )
    assert proc.stdout.split() == ["--warmup"]
    proc = as_console_script(
        cwd=tmp_path, env={"_DIAGNOSE_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "diagnose tri"}
    )
    assert '"trim"' in proc.stdout


def test_every_command_that_writes_takes_quiet(tmp_path: Path) -> None:
    proc = diagnose("trim", str(TRACE), "t.json", "-q", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    proc = diagnose("analyze", "-q", str(TRACE), "--html", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for command in ("report", "compare", "verify", "sweep"):
        assert "--quiet" in diagnose(command, "--help", cwd=tmp_path, env={"COLUMNS": "200"}).stdout


def test_analyze_per_step_and_the_old_steps_flag_still_works(tmp_path: Path) -> None:
    new = diagnose("analyze", str(TRACE), "--per-step", "--no-color", cwd=tmp_path)
    old = diagnose("analyze", str(TRACE), "--steps", "--no-color", cwd=tmp_path)
    assert new.returncode == old.returncode == 0
    assert "per step (ms)" in new.stdout and new.stdout == old.stdout
    assert "diagnose: warning: analyze --steps is now --per-step" in old.stderr and "warning" not in new.stderr
    assert "--steps" not in diagnose("analyze", "--help", cwd=tmp_path, env={"COLUMNS": "200"}).stdout


def test_trim_keep_and_the_old_steps_option_still_works(tmp_path: Path) -> None:
    """trim's count of steps to keep is --keep: --steps counts the profiled steps of run, verify
    and sweep. The old spelling keeps working, with a warning."""
    from diagnose.analysis.trace.timeline import load_timeline

    new = diagnose("trim", str(TRACE), "new.json", "--keep", "2", "--skip", "0", cwd=tmp_path)
    old = diagnose("trim", str(TRACE), "old.json", "--steps", "2", "--skip", "0", cwd=tmp_path)
    assert new.returncode == old.returncode == 0, old.stderr
    assert "diagnose: warning: trim --steps is now --keep" in old.stderr and "warning" not in new.stderr
    assert len(load_timeline(tmp_path / "new.json").steps) == len(load_timeline(tmp_path / "old.json").steps) == 2
    assert "--steps" not in diagnose("trim", "--help", cwd=tmp_path, env={"COLUMNS": "200"}).stdout


@pytest.mark.parametrize("command", [["knobs"], ["rules"], ["rules", "--symptoms"]])
def test_listings_fit_columns(command: list[str], tmp_path: Path) -> None:
    narrow = diagnose(*command, cwd=tmp_path, env={"COLUMNS": "80"}).stdout
    wide = diagnose(*command, cwd=tmp_path, env={"COLUMNS": "1000"}).stdout
    assert max(map(len, wide.splitlines())) > 80
    uncut(narrow, wide, 80)


# --- 14: a profiler-off window much slower than the profiled one is said; shares stay within 100% --


def test_a_much_slower_steady_window_is_said() -> None:
    from diagnose.analysis.measure.breakdown import STEADY_SLOWER, calibrate_to_steady_state
    from tests.test_breakdown import analyse
    from tests.tracebuilder import ELEMENTWISE, TraceBuilder

    b = TraceBuilder()
    b.step(0, 0, 100)
    b.op("aten::linear", 0, 1, forward=True)
    b.backward_op(90, 10)
    b.kernel(ELEMENTWISE, 20, 40, launch_ts=10)
    raw = analyse(b)
    slower = calibrate_to_steady_state(raw, steady_step_us=216)
    assert slower.exposed_share == raw.exposed_share and slower.trace_exposed_share is None
    assert slower.notes[-1].startswith(
        "the profiler-off window was 116% slower than the profiled one (0.2 vs 0.1 ms/step): the shares are of the profiled step"
    )
    just = calibrate_to_steady_state(raw, steady_step_us=100 * STEADY_SLOWER * 0.99)
    assert just.notes == raw.notes


def test_a_share_spread_stays_within_0_and_100_percent() -> None:
    from diagnose.analysis.symptoms.registry import Symptom, Symptoms

    window = Symptoms({"exposed.data_wait": Symptom("exposed.data_wait", 0.95, "share", "")})
    steps = [
        Symptoms({"exposed.data_wait": Symptom("exposed.data_wait", v, "share", "")}) for v in (0.7, 0.8, 0.9, 1.0)
    ]
    spread = window.with_spreads(steps, (0.1, 0.9))["exposed.data_wait"].spread
    assert spread is not None and spread[1] == 1.0 and 0.7 < spread[0] < 0.95


# --- 15: a sweep never runs two points into one folder ---------------------------------------------


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["num_workers=0,2,0,2"], "--set num_workers=0,2,0,2 lists '0' twice"),
        (["num_workers=2,02"], "lists '2' twice (as '02')"),
        (["pin_memory=true,1"], "lists 'true' twice (as '1')"),
        (["num_workers=0,2", "num_workers=4"], "--set num_workers is given twice"),
        (["arg.lr=0.1,0.1"], "lists '0.1' twice"),
    ],
)
def test_a_sweep_refuses_a_repeated_value(assignments: list[str], message: str) -> None:
    from diagnose.errors import UsageError
    from diagnose.experiments import parse_sweep

    with pytest.raises(UsageError) as caught:
        parse_sweep(assignments)
    assert message in caught.value.message


def test_colliding_labels_get_their_own_folders(tmp_path: Path) -> None:
    from diagnose.experiments import child_folders
    from diagnose.rundir import RunDir

    folders = child_folders(RunDir(tmp_path), ["arg.x=a/b", "arg.x=a_b", "arg.x=a:b", "num_workers=2"])
    assert [f.path.name for f in folders] == ["arg.x=a_b", "arg.x=a_b-2", "arg.x=a_b-3", "num_workers=2"]


def test_a_repeated_sweep_value_is_a_usage_error_before_any_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('never run')\n")
    proc = diagnose("sweep", "--set", "num_workers=0,2,0,2", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "lists '0' twice" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_report_of_another_file_says_so_and_its_hint_does_not_fail(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text("{}")
    proc = diagnose("report", "notes.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "diagnose: error: notes.json is a file, not a run directory",
        "hint: give the run directory that holds diagnose/report.json",
    ]


def test_compare_leaves_no_trailing_spaces() -> None:
    from diagnose.analysis.compare import compare_reports
    from diagnose.renderers.comparison import render_comparison

    base = _saved()
    text = render_comparison(compare_reports([("a", base), ("b", _scaled(base, 1.5))]), "terminal", width=60)
    assert [line for line in text.splitlines() if line != line.rstrip()] == []


def test_compare_html_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = diagnose(
        "compare",
        str(DATA / "data_bound"),
        str(DATA / "data_bound"),
        "--json",
        "--html",
        str(tmp_path / "no" / "c.html"),
        cwd=tmp_path,
    )
    assert proc.returncode == 5 and "Traceback" not in proc.stderr
    assert f"diagnose: error: cannot write {tmp_path / 'no' / 'c.html'}: No such file or directory" in proc.stderr

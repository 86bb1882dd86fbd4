"""The run directory: the one owner of a run's files. No other module spells a file name.

Contract: ``RunDir(path)`` names every file of a run (``record_path``, ``report_path``,
``html_path``, ``workers_path``, ``new_trace_path``, ``child``), finds what a run left
(``ranks``, ``traces``, ``trace_for``) and loads and saves it (``load_record``/``save_record``,
``load_report``/``save_report``, ``save_html``; ``events_folder`` for TensorBoard's file).
It renders nothing: ``session`` renders report.html and the events and hands it the text or
the folder (no import of ``diagnose.renderers``). ``RunDir.create`` makes a fresh one before
the script starts, so that a bad path fails fast. No torch import.

Layout (``tensorboard --logdir runs`` finds every run)::

    runs/<script>-<YYYYmmdd-HHMMSS>/
        <host>_<pid>.<ms>.pt.trace.json.gz   the torch.profiler trace that run.json names
        diagnose/run.json                      what the runner saw (schema diagnose.run/1)
        diagnose/report.json                   the analysis (schema diagnose.report/2)
        report.html                            with --html
        events.out.tfevents.*.diagnose         TensorBoard scalars and text (runs that measured steps)
        workers/worker-<pid>.json              DataLoader worker samples (line attribution)
        <label>/                               verify and sweep: one run directory per run
        sweep.png                              sweep: throughput and memory per point

The traces are the only ``*.json``/``*.json.gz`` files at the top: HTA's
``TraceAnalysis(trace_dir=RUN_DIR)`` reads every such file there as a trace, torch-tb-profiler
and Perfetto take the ``*.pt.trace.json.gz`` files as they are. Our own files live in
``diagnose/``. Run directories written before that layout (run.json and report.json at the top)
are still read: each file is looked up in ``diagnose/`` first, then at the top.

A distributed run holds one set per rank instead: ``diagnose/rank<R>.run.json``,
``rank<R>_<host>_<pid>.<ms>.pt.trace.json.gz`` and ``workers-rank<R>/``, plus what each rank's
own analysis wrote: ``diagnose/rank<R>.report.json`` (its report) and
``diagnose/rank<R>.summary.json`` (its ``RankSummary``, what the job's view is built from);
``report.json`` is the ranks' merged report. Only the traces worth opening are kept (the first
rank's, the slowest's, the straggler's, the outliers'), unless every one was asked for.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diagnose.atomic import write_atomically
from diagnose.errors import OutputError, UsageError
from diagnose.record import RunRecord

if TYPE_CHECKING:
    from diagnose.report import Report

#: the subfolder of diagnose's own files (kept away from the traces that other tools read)
OWN_FILES = "diagnose"
RUN_JSON = "run.json"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
#: what a folder of the user's own traces may hold where none is named ``*.pt.trace.json``: HTA
#: reads every JSON file of a trace folder as a trace (``rank-0.json.gz``, ``trace.json``)
ANY_JSON_SUFFIXES = (".json", ".json.gz")
#: the file each process writes and removes at once to learn that it can write into a run
#: directory; never the folder's content: the nodes of a multi-node job create their shared
#: folder at the same instant, and one node's probe once made the other's folder "not empty"
WRITE_PROBE = ".diagnose-write-test-"
_RANK_RECORD = re.compile(r"^rank(\d+)\.run\.json$")
_RANK_SUMMARY = re.compile(r"^rank(\d+)\.summary\.json$")
_RANK_OWN_FILE = re.compile(r"^rank\d+\.(?:run|summary|report)\.json$")
RANK_SUMMARY = "summary.json"
RANK_REPORT = "report.json"


def default_location(name: str, root: Path = Path("runs")) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``, made unique when two runs start in the same second.
    The folder is created here, by an exclusive ``mkdir``: two runs started at the same instant
    (both finding the name free) would otherwise share it; the loser takes the next name."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{name}-{stamp}"
    candidate, n = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        except OSError:
            return candidate  # not creatable: RunDir.create says why, with its exit code


def shared_location(name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """A run directory every rank of a job agrees on without talking to the others."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id in ("", "none"):
        run_id = environ.get("SLURM_JOB_ID") or f"port{environ.get('MASTER_PORT', '0')}"
    return Path("runs") / f"{name}-{run_id}"


def _own_file(name: str) -> bool:
    """A file diagnose writes at a run directory's top in the older layout, never a trace."""
    return name in (RUN_JSON, REPORT_JSON) or bool(_RANK_OWN_FILE.match(name))


def _rank_prefix(rank: int) -> str:
    return f"rank{rank}"


_RANK_TRACE = re.compile(r"^rank(\d+)_")


def rank_of_trace(name: str) -> int | None:
    """The rank a trace's name gives it (``rank<R>_<host>_<pid>...``: ``new_trace_path``), or None."""
    found = _RANK_TRACE.match(name)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class RunDir:
    path: Path

    # --- making one ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, overwrite: bool = False) -> RunDir:
        """Create (or, with ``overwrite``, reuse) the folder and check that it is writable."""
        path = path.expanduser().absolute()
        if path.exists():
            if not path.is_dir():
                raise OutputError(f"the output path {path} exists and is not a folder")
            if not overwrite and any(not p.name.startswith(WRITE_PROBE) for p in path.iterdir()):
                raise OutputError(
                    f"the run directory {path} already exists and is not empty",
                    hint="choose another --out, leave --out away for a fresh runs/<script>-<time>/, or pass --overwrite",
                )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"cannot create the run directory {path}: {exc.strerror}", hint="choose a writable --out"
            ) from exc
        if not os.access(path, os.W_OK):
            raise OutputError(f"the run directory {path} is not writable", hint="choose a writable --out")
        probe = path / f"{WRITE_PROBE}{os.getpid()}"  # per process: ranks share the folder
        try:
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise OutputError(f"cannot write into {path}: {exc.strerror}", hint="choose a writable --out") from exc
        return cls(path)

    @classmethod
    def create_for(cls, name: str, out: Path | None, overwrite: bool = False, shared: bool = False) -> RunDir:
        """``--out`` when given, else a fresh ``runs/<name>-<time>/``; claimed by this process
        (``claim``) before it is checked: two runs started into one new ``--out`` at once
        would both find it empty. A ``shared`` folder (the nodes of a multi-node job all write into
        one) is not claimed: each node's processes write their own names there."""
        path = (out if out is not None else default_location(name)).expanduser().absolute()
        if not shared:
            claim(path)
        return cls.create(path, overwrite=overwrite)

    @classmethod
    def containing(cls, path: Path) -> RunDir:
        """The run directory ``path`` is, or whose own file it names: ``RUN/diagnose/report.json``,
        ``RUN/report.json`` (an older layout) and ``RUN/diagnose/run.json`` are ``RUN``'s."""
        path = Path(path)
        if path.is_file() and (path.name in (REPORT_JSON, RUN_JSON) or _RANK_RECORD.match(path.name)):
            folder = path.parent
            return cls(folder.parent if folder.name == OWN_FILES else folder)
        return cls(path)

    def holds_run(self) -> bool:
        """Whether this is a diagnose run directory (it holds a run record): only those are
        written into by ``analyze``; a folder of a user's own traces is not."""
        return self.record_path().is_file() or bool(self.ranks())

    def child(self, label: str) -> RunDir:
        """The folder of one run of a verify or sweep, named after its label (not created)."""
        slug = "".join(c if c.isalnum() or c in "=.-_" else "_" for c in label).strip("_")[:80]
        return RunDir(self.path / (slug if slug.strip(".") else "run"))

    def check_run(self, rule: str) -> RunDir:
        """The folder of ``diagnose run``'s short A/B of one finding (its check), inside the run's."""
        return self.child(f"check-{rule}")

    # --- names --------------------------------------------------------------------------------

    @property
    def own_path(self) -> Path:
        """``diagnose/``: run.json and report.json, where no trace reader looks."""
        return self.path / OWN_FILES

    def record_path(self, rank: int | None = None) -> Path:
        """Where the record is (an older layout's, when only that one exists), else where it goes."""
        return self._existing(RUN_JSON if rank is None else f"{_rank_prefix(rank)}.{RUN_JSON}")

    @property
    def report_path(self) -> Path:
        return self._existing(REPORT_JSON)

    def _existing(self, name: str) -> Path:
        own, legacy = self.own_path / name, self.path / name
        return legacy if legacy.is_file() and not own.is_file() else own

    @property
    def html_path(self) -> Path:
        return self.path / REPORT_HTML

    @property
    def events_folder(self) -> Path:
        """Where the TensorBoard event file goes (the renderer names it: ``events.out.tfevents.*``):
        the run directory itself, so that ``tensorboard --logdir runs`` lists each run."""
        return self.path

    @property
    def plot_path(self) -> Path:
        """A sweep's chart of throughput and memory per point."""
        return self.path / "sweep.png"

    def workers_path(self, rank: int | None = None) -> Path:
        """Where the DataLoader workers of this process leave their samples."""
        return self.path / ("workers" if rank is None else f"workers-{_rank_prefix(rank)}")

    def watch_trace_path(self, index: int, step: int, rank: int | None = None) -> Path:
        """``watch[-rank<R>]/window<I>-step<K>.pt.trace.json.gz``: a short window that ``diagnose
        watch`` profiled later in the run (a folder of its own: the top-level traces are the
        main window's, which HTA and ``trace_for`` read)."""
        folder = self.path / ("watch" if rank is None else f"watch-{_rank_prefix(rank)}")
        return folder / f"window{index}-step{step}.pt.trace.json.gz"

    def new_trace_path(self, rank: int | None = None) -> Path:
        """``[rank<R>_]<host>_<pid>.<ms>.pt.trace.json.gz``: the name torch-tb-profiler looks for;
        the rank prefix tells ranks apart."""
        worker = f"{socket.gethostname()}_{os.getpid()}"
        if rank is not None:
            worker = f"{_rank_prefix(rank)}_{worker}"
        return self.path / f"{worker}.{int(time.time() * 1000)}.pt.trace.json.gz"

    # --- what a run left ----------------------------------------------------------------------

    def ranks(self) -> list[int]:
        """The ranks that saved a record here (empty for a single-process run)."""
        names = [p.name for folder in (self.own_path, self.path) if folder.is_dir() for p in folder.iterdir()]
        return sorted({int(m.group(1)) for m in map(_RANK_RECORD.match, names) if m})

    def traces(self, rank: int | None = None) -> list[Path]:
        """Trace files in the folder (one rank's with ``rank``), sorted by name; in a folder of the
        user's own traces with no ``*.pt.trace.json(.gz)``, its other JSON files. Never an empty
        file, nor a ``.gz`` beside its own uncompressed trace: that is a compression cut short
        (diagnose removes the raw trace only once the ``.gz`` is complete)."""
        prefix = "" if rank is None else f"{_rank_prefix(rank)}_"
        files = [p for p in self.path.iterdir() if p.is_file() and p.name.startswith(prefix) and p.stat().st_size > 0]
        found = [p for p in files if p.name.endswith(TRACE_SUFFIXES)]
        if not found and rank is None and not self.holds_run():
            # a folder of the user's own traces, named as they chose: every JSON file but ours
            found = [p for p in files if p.name.endswith(ANY_JSON_SUFFIXES) and not _own_file(p.name)]
        names = {p.name for p in found}
        found = [p for p in found if not (p.name.endswith(".gz") and p.name[: -len(".gz")] in names)]
        return sorted(found, key=lambda p: p.name)

    def trace_for(self, record: RunRecord | None, rank: int | None = None) -> tuple[Path | None, list[str]]:
        """The trace to analyse, and warnings. The one the record names (its latest window) wins:
        another trace in the folder may be an earlier run's (``--overwrite``) or the script's own.
        A record that names none gets none; without a record (or when the one it names is gone),
        the folder's last trace by name."""
        present = self.traces(rank)
        named = [self.path / name for name in (record.trace_files if record is not None else [])]
        named = [p for p in named if p in present]  # an empty one is no trace
        if named:
            chosen = named[-1]
            others = [p for p in present if p != chosen]
            warnings = (
                [f"{len(others)} other trace(s) in the run directory; analysed {chosen.name}, the one its record names"]
                if others
                else []
            )
            return chosen, warnings
        if record is not None and not record.trace_files:
            # a diagnose run that saved no trace: any trace here is the script's own (its
            # torch.profiler writing into the run directory) or an earlier run's, not this window
            ignored = (
                [f"{len(present)} trace(s) in the run directory that its record does not name were not analysed"]
                if present
                else []
            )
            return None, ignored
        if not present:
            return None, []
        chosen = present[-1]
        warnings = [f"{len(present)} traces in the run directory; analysed {chosen.name}"] if len(present) > 1 else []
        return chosen, warnings

    def wait_for_ranks(self, world_size: int, timeout_s: float = 120.0, summaries: bool = False) -> list[int]:
        """Rank 0 waits for every rank's record (with ``summaries``: its summary, written after
        its own analysis); they stop at the same step, give or take."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.summary_ranks() if summaries else self.ranks()
            if len(found) >= world_size or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    # --- each rank's own analysis -------------------------------------------------------------

    def rank_summary_path(self, rank: int) -> Path:
        return self.own_path / f"{_rank_prefix(rank)}.{RANK_SUMMARY}"

    def rank_report_path(self, rank: int) -> Path:
        return self.own_path / f"{_rank_prefix(rank)}.{RANK_REPORT}"

    def summary_ranks(self) -> list[int]:
        """The ranks that saved a summary here."""
        if not self.own_path.is_dir():
            return []
        return sorted(
            {int(m.group(1)) for m in map(_RANK_SUMMARY.match, (p.name for p in self.own_path.iterdir())) if m}
        )

    def save_rank_summary(self, rank: int, summary: dict) -> Path:
        """Written whole under a temporary name, then renamed: a rank that waits for it never
        reads half a file."""
        return self._write(self.rank_summary_path(rank), lambda p: write_atomically(p, json.dumps(summary, indent=1)))

    def load_rank_summaries(self) -> dict[int, dict]:
        """Each rank's summary, by rank (a run of an older diagnose has none)."""
        found = {}
        for rank in self.summary_ranks():
            try:
                found[rank] = json.loads(self.rank_summary_path(rank).read_text())
            except (OSError, ValueError) as exc:
                raise UsageError(
                    f"cannot read {self.rank_summary_path(rank)}: {exc}", hint="re-run the job to write it again"
                ) from None
        return found

    def save_rank_report(self, rank: int, report: Report) -> Path:
        return self._write(self.rank_report_path(rank), report.save)

    def remove_traces(self, ranks: list[int]) -> list[Path]:
        """Remove these ranks' traces (their summaries and reports stay); the paths removed."""
        removed = []
        for rank in ranks:
            for trace in self.traces(rank):
                try:
                    trace.unlink()
                    removed.append(trace)
                except OSError:
                    pass  # already gone, or not ours to remove: it stays
        return removed

    # --- load and save ------------------------------------------------------------------------

    def load_record(self, rank: int | None = None) -> RunRecord | None:
        path = self.record_path(rank)
        return _load_record(path) if path.is_file() else None

    def load_ranks(self) -> dict[int, RunRecord]:
        """Each rank's record, by rank (empty for a single-process run)."""
        return {rank: _load_record(self.record_path(rank)) for rank in self.ranks()}

    def save_record(self, record: RunRecord, rank: int | None = None) -> Path:
        return self._write(self.record_path(rank), record.save)

    def load_report(self) -> Report:
        from diagnose.report import Report

        path = self.report_path
        if self.path.is_file():  # not a run directory, nor a run's own report.json (RunDir.containing)
            raise UsageError(
                f"{self.path} is a file, not a run directory",
                hint=f"give the run directory that holds {OWN_FILES}/{REPORT_JSON}",
            )
        if not path.is_file():
            raise UsageError(f"no {REPORT_JSON} in {self.path}", hint=f"diagnose analyze {self.path} makes one")
        try:
            return Report.load(path)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise UsageError(f"cannot read {path}: {exc}", hint=f"diagnose analyze {self.path} rewrites it") from None

    def save_report(self, report: Report) -> Path:
        return self._write(self.report_path, report.save)

    def save_html(self, page: str) -> Path:
        """report.html, as rendered (``session.write_html``), whole or not at all."""
        return self._write(self.html_path, lambda path: write_atomically(path, page))

    @staticmethod
    def _write(path: Path, write: Callable[[Path], object]) -> Path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(path)
        except OSError as exc:
            raise write_error(path, exc) from exc
        return path


def write_error(path: Path, exc: OSError) -> OutputError:
    """``cannot write PATH: why``, with what to do where the cause is known."""
    hints = {
        errno.ENOSPC: f"the disk is full: free some space where {path.parent} is (df -h)",
        errno.EDQUOT: "the disk quota is used up: free some space",
        errno.EFBIG: "a file-size limit was reached (ulimit -f)",
        errno.EROFS: "the file system is read-only: write somewhere else (--out where a command takes it)",
        errno.EACCES: "no permission to write there: write somewhere else (--out where a command takes it)",
    }
    return OutputError(f"cannot write {path}: {exc.strerror or exc}", hint=hints.get(exc.errno or 0))


#: the run directories this process has claimed: path -> the open folder its lock is on
_CLAIMED: dict[Path, int] = {}


def claim(path: Path) -> None:
    """Take the run directory for this process (and the processes it forks) until it exits: an
    exclusive ``flock`` on the folder itself (no file left behind; the kernel lets it go with
    the process, however it ends). Another process that holds it: ``OutputError``, exit 5.
    Where locks are not supported (a network file system without them), nothing is claimed."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return
    path = path.absolute()
    if path in _CLAIMED:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # RunDir.create says why it cannot be made, with its exit code
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputError(
            f"another diagnose run is writing into {path}", hint="choose another --out, or wait for it to end"
        ) from None
    except OSError:
        os.close(fd)
        return
    _CLAIMED[path] = fd


def write_file_whole(path: Path, raw: bytes) -> Path:
    """``raw`` into ``path`` whole or not at all (``write_atomically``): a full or read-only file
    system leaves neither an empty nor a cut file, and an existing file stays as it was. An
    ``OutputError`` says why it failed (``write_error``)."""
    try:
        return write_atomically(path, raw)
    except OSError as exc:
        raise write_error(path, exc) from None


def _load_record(path: Path) -> RunRecord:
    """A run.json, or one line saying why it cannot be used (corrupt, edited, cut short)."""
    try:
        return RunRecord.load(path)
    except (OSError, ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise UsageError(
            f"cannot read {path}: {exc}",
            hint="a run.json is written by diagnose run; re-run the script to get a new one",
        ) from None

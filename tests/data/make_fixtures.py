"""Make the recorded GPU fixtures of tests/test_fixtures.py from a ``benchmarks/truth.py`` run.

    python tests/data/make_fixtures.py TRUTH_DIR [TRUTH_DIR ...]

For each planted example found (TRUTH_DIR/<example>/baseline-1/), this writes
tests/data/<example>/ with the trace trimmed to a few steps (diagnose.analysis.trace.trim), the run's
run.json, and expected.json: the breakdown of those steps computed from the *untrimmed* trace,
the findings, and the source line the report must quote. It refuses to write a fixture whose
trimmed trace does not reproduce the untrimmed breakdown exactly.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from diagnose.analysis.measure.breakdown import compute_breakdown
from diagnose.analysis.trace.timeline import load_timeline
from diagnose.analysis.trace.trim import trim_file

HERE = Path(__file__).resolve().parent

#: example -> (steps kept, steps skipped, planted rule, a fragment of the line the report must
#: quote or None). forloop_optimizer keeps one step: its 4,000 kernels a step are the point.
PLANTED = {
    "data_bound": (2, 3, "DATA001", "Image.open"),
    "pageable_copies": (2, 3, "DATA002", "x.to(dev)"),
    "fp32_transformer": (2, 3, "PREC001", "model(x)"),
    "launch_bound": (2, 3, "LAUNCH001", "model(x)"),
    "item_syncs": (2, 3, "SYNC001", "value.item()"),
    "forloop_optimizer": (1, 1, "OPT001", "opt.step()"),
    "cpu_preprocessing": (2, 3, "DATA004", "augment"),
    "well_tuned": (2, 3, None, None),
}


def make(example: str, source_run: Path) -> None:
    steps, skip, rule, line = PLANTED[example]
    (trace,) = RunDir(source_run).traces()
    out = HERE / example
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    trimmed = trim_file(trace, out / trace.name, steps=steps, skip=skip)
    full = {s.number: s for s in compute_breakdown(load_timeline(trace)).steps}
    small = compute_breakdown(load_timeline(trimmed)).steps
    for s in small:
        f = full[s.number]
        for view in ("exposed", "phases"):
            for key, value in getattr(s, view).items():
                if abs(getattr(f, view)[key] - value) > 1e-6:
                    raise SystemExit(f"{example}: trimming changed step {s.number} {view}.{key}")
    run = json.loads((source_run / "run.json").read_text())
    run["trace_files"] = [trimmed.name]
    (out / "run.json").write_text(json.dumps(run, indent=1))
    report = analyze_run(RunDir(out), AnalysisOptions.load())
    expected = {
        "planted_rule": rule,
        "line": line,
        "findings": [f["rule"] for f in report.findings],
        "next_steps": [f["rule"] for f in report.next_steps],
        "steps": {
            str(s.number): {
                "duration_us": full[s.number].duration_us,
                "exposed_us": full[s.number].exposed,
                "phases_us": full[s.number].phases,
                "kernels": full[s.number].kernel_count,
                "syncs": full[s.number].sync_count,
                "h2d_pageable_bytes": full[s.number].h2d_pageable_bytes,
            }
            for s in small
        },
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(f"{example}: {trimmed.stat().st_size // 1000} KB, findings {expected['findings']} next {expected['next_steps']}")


def main() -> None:
    for root in map(Path, sys.argv[1:]):
        for example in PLANTED:
            run = root / example / "baseline-1"
            if run.is_dir():
                make(example, run)


if __name__ == "__main__":
    main()

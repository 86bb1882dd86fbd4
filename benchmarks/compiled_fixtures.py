"""Record GPU traces of compiled models and the framework loops, for tests/data fixtures.

    python benchmarks/compiled_fixtures.py OUT_DIR [--only NAME ...]

Runs ``diagnose run`` (warm-up 8 steps: compilation, CUDA-graph recording) on each case below,
then trims each run's trace to 3 steps into OUT_DIR/fixtures/<name>/ with its run.json, ready to
copy under tests/data/. Prints each run's phase shares, compile record and findings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._bench import run_in_repo
from diagnose.rundir import RunDir

#: name -> the script and its arguments, relative to the repository
CASES: dict[str, list[str]] = {
    "compiled_eager_gpu": ["tests/frameworks/compiled_gpt.py", "--compile", "none"],
    "compiled_default_gpu": ["tests/frameworks/compiled_gpt.py", "--compile", "default"],
    "compiled_reduce_overhead_gpu": ["tests/frameworks/compiled_gpt.py", "--compile", "reduce-overhead"],
    "compiled_graph_break_gpu": ["tests/frameworks/compiled_gpt.py", "--compile", "default", "--graph-break"],
    "closure_gpu": ["tests/frameworks/closure_sgd.py", "--device", "cuda"],
    "lightning_gpu": ["tests/frameworks/lightning_auto.py", "--accelerator", "gpu"],
    "hf_trainer_gpu": ["tests/frameworks/hf_trainer.py", "--gpu"],
    "accelerate_gpu": ["tests/frameworks/accelerate_loop.py", "--gpu"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", default=None)
    args = p.parse_args()
    from diagnose.analysis.trace.trim import trim_file

    for name, command in CASES.items():
        if args.only and name not in args.only:
            continue
        run_dir = args.out / "runs" / name
        # --no-check: a fixture's report is the analysis of its own trace, not of A/B reruns
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--no-check",
            "--warmup",
            "8",
            "--steps",
            "6",
            "--timed-steps",
            "20",
            "--overwrite",
            "-o",
            str(run_dir),
            "--json",
            "-q",
            command[0],
            "--",
            *command[1:],
        ]
        result = run_in_repo(cmd, timeout=900)
        if result.returncode != 0:
            print(f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}")
            continue
        report = json.loads(result.stdout)
        record = json.loads(RunDir(run_dir).record_path().read_text())
        fixture = args.out / "fixtures" / name
        shutil.rmtree(fixture, ignore_errors=True)
        fixture.mkdir(parents=True)
        (trace,) = RunDir(run_dir).traces()
        trimmed = trim_file(trace, fixture / trace.name, steps=3, skip=2)
        record["trace_files"] = [trimmed.name]
        (fixture / "run.json").write_text(json.dumps(record, indent=1))
        phases = report["breakdown"]["window"]["phase_share"]
        compiled = {
            k: record.get("compile", {}).get(k)
            for k in ("modes", "cudagraphs", "graph_break_count", "compiles_after_warmup")
        }
        print(f"{name}: phases {json.dumps({k: round(v, 3) for k, v in phases.items()})}")
        print(
            f"  compile {compiled}  findings {[f['rule'] for f in report['findings']]}  next {[f['rule'] for f in report['next_steps']]}"
        )


if __name__ == "__main__":
    main()

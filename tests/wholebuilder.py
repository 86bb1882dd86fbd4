"""A hand-built ``record.whole`` (``diagnose watch``) whose accounting is worked out by hand.

Eleven steps (boundaries at 1..10 s, then 14 s; the last optimizer step at 14.5 s), the process
started at -1 s and the script ended at 15 s: 16 s of wall-clock. Spans: a first compilation
1.0-1.3 and a recompilation 3.0-3.1, an evaluation 5.0-5.5, two checkpoints 7.2-7.4 and
9.2-9.4, two DataLoader starts (0.9 + 0.2 s, 6.0 + 0.3 s; 2 workers, not persistent). Steps'
unexplained times: 0.7 1 0.9 1 0.5 0.7 0.8 1 0.8 4 0.5; their median 0.8, so step 9 (4 s, over
3 x 0.8) stalls by 3.2 s. Buckets: start-up 1.9 (2 s less the first loader's 0.1 before the
compile), compile 0.4, data start-up 0.1 + 0.3, eval 0.5, checkpoint 0.4, train 11.9 - 3.2 =
8.7, stalls 3.2, teardown 0.5: 16 s.
"""

from __future__ import annotations

from typing import Any

from diagnose.record import RunRecord

WALL_S = 16.0
SECONDS = {
    "startup": 1.9,
    "compile": 0.4,
    "data_startup": 0.4,
    "train": 8.7,
    "eval": 0.5,
    "checkpoint": 0.4,
    "gc": 0.0,
    "profiling": 0.0,
    "contention": 0.0,
    "stalls": 3.2,
    "teardown": 0.5,
}


def whole_record(**changes: Any) -> RunRecord:
    whole: dict[str, Any] = {
        "version": 1,
        "process_start_s": -1.0,
        "script_end_s": 15.0,
        "boundaries_s": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 14.0],
        "merged_pairs": 0,
        "last_optimizer_step_s": 14.5,
        "spans": [
            {"kind": "eval", "start": 5.0, "end": 5.5, "name": "HF Trainer.evaluate (eval_strategy / eval_steps)"},
            {"kind": "checkpoint", "start": 7.2, "end": 7.4, "name": "torch.save"},
            {"kind": "checkpoint", "start": 9.2, "end": 9.4, "name": "torch.save"},
        ],
        "loaders": [
            {
                "created_at": "train.py:10",
                "num_workers": 2,
                "persistent_workers": False,
                "starts": [[0.9, 0.2], [6.0, 0.3]],
            }
        ],
        "compiles": [
            {"start": 1.0, "end": 1.3, "frame": "forward (train.py:5)", "reason": None},
            {
                "start": 3.0,
                "end": 3.1,
                "frame": "forward (train.py:5)",
                "reason": "tensor 'x' size mismatch at index 1. expected 8, actual 9",
            },
        ],
        "samples": [
            {"t": float(t), "steps": t - 1, "data_wait_s": 0.0, "rss_bytes": int(rss * 1e6)}
            for t, rss in ((2, 100), (4, 110), (6, 120), (8, 130), (10, 140))
        ],
        "windows": [],
        "capacity": {"host_bytes": int(1e9)},
        "budget": {},
        "notes": [],
    }
    whole.update(changes)
    return RunRecord(
        plan={"warmup": 0, "steps": 2, "timed": 2, "stop": False, "max_steps": None}, script_start_s=100.0, whole=whole
    )

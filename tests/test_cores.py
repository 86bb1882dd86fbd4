"""Physical cores: hyperthreads of one core count once when sizing DataLoader workers."""

from __future__ import annotations

from pathlib import Path

from diagnose.analysis.prediction.predict import more_workers
from diagnose.analysis.prediction.replay import replay
from diagnose.analysis.symptoms.dataloader import suggested_workers as SUGGESTED
from diagnose.analysis.symptoms.dataloader import workers_basis as BASIS
from diagnose.analysis.symptoms.registry import Known
from diagnose.runtime.environment import physical_cores
from tests.test_replay import loader_steps, model_of


def fake_sysfs(root: Path, cores: list[tuple[int, int]]) -> Path:
    """cpuN's (package, core) ids, as /sys/devices/system/cpu shows them."""
    for cpu, (package, core) in enumerate(cores):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_id").write_text(f"{core}\n")
        (topology / "physical_package_id").write_text(f"{package}\n")
    return root


def test_hyperthreads_of_one_core_count_once(tmp_path: Path) -> None:
    sysfs = str(fake_sysfs(tmp_path, [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 0)]))
    assert physical_cores({0, 1, 2, 3}, sysfs) == 2  # CPUs 0 and 2 share core 0, 1 and 3 core 1
    assert physical_cores({0, 1, 4, 5}, sysfs) == 3  # core 0 of the second package once
    assert physical_cores({0, 9}, sysfs) is None  # no topology for CPU 9: unknown, not a guess


def suggested_workers(values: dict[str, float]) -> object:
    return SUGGESTED.compute(known=Known(values, SUGGESTED))


def workers_basis(values: dict[str, float]) -> object:
    return BASIS.compute(known=Known(values, BASIS))


def test_workers_are_sized_by_physical_cores() -> None:
    known = {
        "dataloader.num_workers": 0,
        "exposed.data_wait": 0.95,
        "phase.data_wait": 0.95,
        "gpu.present": 1,
        "cpu.count": 16,
    }
    assert suggested_workers(known) == 15
    assert suggested_workers({**known, "cpu.cores": 8}) == 7
    assert (
        workers_basis({**known, "cpu.cores": 8})
        == "16 CPUs on 8 physical cores: at most 7 workers beside the main process"
    )
    assert workers_basis({**known, "cpu.cores": 16}) == "16 CPUs: at most 15 workers beside the main process"


def test_more_workers_counts_a_core_once() -> None:
    """One batch takes 100 µs of one core: 4 workers on 8 CPUs keep up, on 8 CPUs that are 2
    cores only one worker fits (the other core stays with the main process)."""
    model = model_of(loader_steps())
    facts = {"dataloader.num_workers": 0, "cpu.count": 8}
    assert replay(more_workers(model, facts, num_workers=4)).window_us == 100.0
    assert (
        replay(more_workers(model, {**facts, "cpu.cores": 2}, num_workers=4)).window_us == 200.0
    )  # two steps at the one worker's pace

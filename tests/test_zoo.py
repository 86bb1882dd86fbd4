"""The outside corpus (benchmarks/zoo, issue 32): the manifest's invariants, the split rule,
fetching from a git mirror at a pinned commit, the generated data, the runner on scripts that
start and scripts that fail, and the scores on a hand-written results.jsonl, exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

import calibrate  # noqa: E402
import corpus  # noqa: E402
import fetch  # noqa: E402
import prepare  # noqa: E402
import run as zoo_run  # noqa: E402
import score  # noqa: E402

SPDX = {"MIT", "BSD-3-Clause", "Apache-2.0", "BSD-2-Clause"}


# ------------------------------------------------------------------ the manifest


def test_the_manifest_holds_what_issue_32_asks() -> None:
    manifest = corpus.load()
    assert corpus.problems(manifest) == []
    assert len(manifest.scripts) >= 20
    assert len({s.repo.name for s in manifest.scripts}) >= 8
    for s in manifest.scripts:
        assert corpus.COMMIT_RE.match(s.commit), s.name
        assert s.licence in SPDX, s.name
        assert s.path.endswith(".py") and s.domain and s.kind in corpus.KINDS, s.name
        assert s.half in corpus.GROUPS, s.name
        assert s.cpu_args is not None or s.cpu_skip, s.name
        assert s.gpu_s > 0, s.name
    halves_of_repo: dict[str, set[str]] = {}
    for s in manifest.scripts:
        halves_of_repo.setdefault(s.repo.name, set()).add(s.half)
    assert all(len(h) == 1 for h in halves_of_repo.values()), halves_of_repo
    assert manifest.half("calibration") and manifest.half("evaluation")
    assert sum(len(manifest.half(g)) for g in corpus.GROUPS) == len(manifest.scripts)
    # the holdout groups: each its own repositories, none of the split's nor another group's
    split = {s.repo.name for h in corpus.HALVES for s in manifest.half(h)}
    seen: set[str] = set()
    for group in corpus.HOLDOUTS:
        held = {s.repo.name for s in manifest.half(group)}
        assert held == set(manifest.holdout_groups[group]), group
        assert not held & split and not held & seen, group
        seen |= held
    assert seen == set(manifest.holdout_repos)


def test_the_split_rule_largest_repository_first_then_the_smaller_half() -> None:
    # sha256("b/two") starts a3f7, sha256("c/three") d357: b/two comes first of the two-script ones
    counts = {"big/five": 5, "a/one": 1, "b/two": 2, "c/three": 2}
    assert corpus.split_halves(counts) == {
        "big/five": "calibration",  # 0 <= 0: a tie goes to calibration
        "b/two": "evaluation",  # 5 > 0
        "c/three": "evaluation",  # 5 > 2
        "a/one": "evaluation",  # 5 > 4
    }


def test_the_split_rule_is_a_function_of_names_and_counts_only() -> None:
    counts = {"x/a": 3, "x/b": 3, "x/c": 1, "x/d": 1}
    halves = corpus.split_halves(counts)
    assert halves == corpus.split_halves(dict(reversed(list(counts.items()))))
    sizes = {h: sum(n for r, n in counts.items() if halves[r] == h) for h in corpus.HALVES}
    assert sizes == {"calibration": 4, "evaluation": 4}


def _manifest(tmp_path: Path, body: str) -> corpus.Corpus:
    path = tmp_path / "manifest.toml"
    path.write_text(textwrap.dedent(body))
    return corpus.load(path)


def _repo(name: str, commit: str = "0123456789" * 4) -> str:
    """A [repos] entry of a manifest, one file to fetch."""
    return f'\n[repos."{name}"]\ncommit = "{commit}"\nlicence = "MIT"\ninclude = ["t.py"]\n'


def _script(name: str, repo: str, half: str, domain: str | None = "vision", cpu: str = "cpu_args = []") -> str:
    """A [[script]] entry of a manifest (``domain`` None: without one)."""
    lines = [f'name = "{name}"', f'repo = "{repo}"', 'path = "t.py"']
    lines += [f'domain = "{domain}"'] if domain else []
    lines += ['kind = "plain"', cpu, f'half = "{half}"']
    return "\n[[script]]\n" + "\n".join(lines) + "\n"


def test_problems_names_a_short_commit_a_missing_field_and_a_repository_split_across_halves(tmp_path: Path) -> None:
    manifest = _manifest(
        tmp_path,
        _repo("o/r", commit="abc123")
        + _script("one", "o/r", "calibration")
        + _script("two", "o/r", "evaluation", domain=None, cpu='cpu_skip = "gpu"'),
    )
    assert corpus.problems(manifest) == [
        "repository o/r: commit 'abc123' is not 40 hex digits",
        "script two: no domain",
        "script two: half evaluation, the split rule gives calibration",
    ]


def _manifest_of(tmp_path: Path, header: str, scripts: list[tuple[str, str, str]]) -> corpus.Corpus:
    """A manifest of ``header``, each script (name, repository, half), and a [repos] entry for
    each repository in the order they first come."""
    repos = dict.fromkeys(repo for _, repo, _ in scripts)
    return _manifest(
        tmp_path, header + "".join(_repo(name) for name in repos) + "".join(_script(*script) for script in scripts)
    )


def test_the_holdout_group_stands_outside_the_split(tmp_path: Path) -> None:
    """A repository added after the split is counted by no half's rule (the split of the other
    repositories stays as it was); its scripts are holdout, and a holdout script's repository must
    be listed in [holdout]."""
    manifest = _manifest_of(
        tmp_path,
        '[holdout]\nrepos = ["h/new"]\n',
        [
            ("one", "o/r", "calibration"),
            ("two", "h/new", "holdout"),
            ("three", "h/new", "evaluation"),
            ("four", "x/late", "holdout"),
        ],
    )
    assert manifest.holdout_repos == ("h/new",)
    assert [s.name for s in manifest.half("holdout")] == ["two", "four"]
    assert corpus.problems(manifest) == [
        "script three: half evaluation, but h/new is in the holdout group",
        "script four: half holdout, but [holdout] does not list x/late",
    ]
    # the split counts o/r alone: its one script, calibration, is what the rule gives
    assert not any("split rule" in line for line in corpus.problems(manifest))
    # a second group, added after the first ran: its own table, its own repositories
    second = _manifest_of(
        tmp_path,
        '[holdout]\nrepos = ["h/new"]\n[holdout2]\nrepos = ["h/newer"]\n',
        [
            ("one", "o/r", "calibration"),
            ("two", "h/new", "holdout"),
            ("five", "h/newer", "holdout2"),
            ("six", "h/newer", "holdout"),
        ],
    )
    assert second.holdout_groups == {"holdout": ("h/new",), "holdout2": ("h/newer",)}
    assert [s.name for s in second.half("holdout2")] == ["five"]
    assert [line for line in corpus.problems(second) if line.startswith("script")] == [
        "script six: half holdout, but [holdout] does not list h/newer"
    ]


# ------------------------------------------------------------------ fetch


def _git(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True, env=env, timeout=60
    ).stdout.strip()


def test_fetch_takes_only_the_included_paths_of_the_pinned_commit_from_a_mirror(tmp_path: Path) -> None:
    origin = tmp_path / "mirror" / "o+r" / "repo"
    (origin / "pkg").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(origin)], check=True, timeout=60)
    (origin / "train.py").write_text("print('pinned')\n")
    (origin / "pkg" / "a.py").write_text("")
    (origin / "big.bin").write_text("data")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-qm", "one")
    pinned = _git(origin, "rev-parse", "HEAD")
    (origin / "train.py").write_text("print('later')\n")
    _git(origin, "commit", "-qam", "two")

    repo = corpus.Repo("o/r", pinned, "MIT", ("train.py", "pkg/*.py"))
    dest = tmp_path / "dest"
    said = fetch.fetch_repo(repo, dest, tmp_path / "mirror")
    assert "2 files" in said
    assert (dest / "o+r" / "train.py").read_text() == "print('pinned')\n"
    assert (dest / "o+r" / "pkg" / "a.py").exists() and not (dest / "o+r" / "big.bin").exists()
    assert fetch.fetched_commit(dest / "o+r") == pinned
    assert "already at" in fetch.fetch_repo(repo, dest, tmp_path / "mirror")
    more = corpus.Repo("o/r", pinned, "MIT", ("train.py", "pkg/*.py", "big.bin"))
    assert "3 files" in fetch.fetch_repo(more, dest, tmp_path / "mirror")  # another include: fetched again
    assert (dest / "o+r" / "big.bin").exists()

    absent = corpus.Repo("o/r", "0" * 40, "MIT", ("train.py",))
    with pytest.raises(fetch.FetchError, match="has no commit 0000000000000000000000000000000000000000"):
        fetch.fetch_repo(absent, tmp_path / "dest2", tmp_path / "mirror")


def test_included_paths_are_folders_files_or_globs_that_cross_folders() -> None:
    include = ("timm", "train.py", "word_language_model/*.py")
    assert fetch.wanted("timm/models/resnet.py", include)
    assert fetch.wanted("train.py", include)
    assert fetch.wanted("word_language_model/main.py", include)
    assert not fetch.wanted("timmy.py", include)
    assert not fetch.wanted("word_language_model/data/wikitext-2/train.txt", include)


# ------------------------------------------------------------------ generated data


def test_generated_mnist_is_in_the_idx_layout_torchvision_reads(tmp_path: Path) -> None:
    step = {"kind": "mnist", "dest": "{src}/data", "train": 12, "test": 3}
    prepare.prepare(step, tmp_path)
    raw = tmp_path / "data" / "MNIST" / "raw"
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    assert images[:16] == bytes.fromhex("00000803 0000000c 0000001c 0000001c".replace(" ", ""))
    assert len(images) == 16 + 12 * 28 * 28
    assert len((raw / "t10k-labels-idx1-ubyte").read_bytes()) == 8 + 3
    assert "already there" in prepare.prepare(step, tmp_path)


def test_generated_text_tokens_and_images(tmp_path: Path) -> None:
    prepare.prepare(
        {"kind": "text", "dest": "{src}/t", "files": ["train.txt", "valid.txt"], "words": 1000, "vocab": 50}, tmp_path
    )
    train = [w.lower() for w in (tmp_path / "t" / "train.txt").read_text().split() if w not in ".!?,"]
    assert len(train) == 1000
    assert len(set(train)) <= 50
    assert len([w for w in (tmp_path / "t" / "valid.txt").read_text().split() if w not in ".!?,"]) == 100

    prepare.prepare({"kind": "lines", "dest": "{src}/n", "file": "names.txt", "lines": 300}, tmp_path)
    names = (tmp_path / "n" / "names.txt").read_text().splitlines()
    assert len(names) == len(set(names)) == 300
    assert all(name.isalpha() and name.islower() and 2 <= len(name) <= 9 for name in names)

    prepare.prepare({"kind": "tokens", "dest": "{src}/d", "tokens": 5000, "vocab": 65}, tmp_path)
    assert (tmp_path / "d" / "train.bin").stat().st_size == 2 * 5000
    assert (tmp_path / "d" / "val.bin").stat().st_size == 2 * 4096

    prepare.prepare(
        {"kind": "images", "dest": "{src}/i", "count": 4, "size": 16, "layout": "labelled", "classes": 2}, tmp_path
    )
    assert sorted(p.name for p in (tmp_path / "i").glob("*.jpg")) == [
        "breed0_0.jpg",
        "breed0_2.jpg",
        "breed1_1.jpg",
        "breed1_3.jpg",
    ]
    prepare.prepare(
        {"kind": "images", "dest": "{src}/f", "count": 3, "size": 16, "layout": "classes", "classes": 2}, tmp_path
    )
    assert sorted(str(p.relative_to(tmp_path / "f")) for p in (tmp_path / "f").rglob("*.jpg")) == [
        "class_0/img_00000.jpg",
        "class_0/img_00002.jpg",
        "class_1/img_00001.jpg",
    ]


def test_a_generated_citation_graph_is_in_coras_layout_pygcn_reads(tmp_path: Path) -> None:
    step = {"kind": "citation-graph", "dest": "{src}/data/cora", "nodes": 60, "features": 20, "classes": 3, "edges": 90}
    prepare.prepare(step, tmp_path)
    content = [line.split("\t") for line in (tmp_path / "data" / "cora" / "cora.content").read_text().splitlines()]
    assert len(content) == 60 and {len(row) for row in content} == {1 + 20 + 1}
    assert all(set(row[1:-1]) <= {"0", "1"} for row in content)
    assert {row[-1] for row in content} <= {"class_0", "class_1", "class_2"}
    ids = {row[0] for row in content}
    assert len(ids) == 60
    cites = [tuple(line.split("\t")) for line in (tmp_path / "data" / "cora" / "cora.cites").read_text().splitlines()]
    assert len(cites) == len(set(cites)) == 90
    assert all(a in ids and b in ids and a != b for a, b in cites)
    assert not {(b, a) for a, b in cites} & set(cites)
    assert "already there" in prepare.prepare(step, tmp_path)


def test_generated_point_clouds_are_in_modelnet40s_resampled_layout(tmp_path: Path) -> None:
    step = {"kind": "point-clouds", "dest": "{src}/m", "classes": 3, "train": 2, "test": 1, "points": 50}
    prepare.prepare(step, tmp_path)
    root = tmp_path / "m"
    names = (root / "modelnet40_shape_names.txt").read_text().split()
    assert names == ["shape00", "shape01", "shape02"]
    train = (root / "modelnet40_train.txt").read_text().split()
    test = (root / "modelnet40_test.txt").read_text().split()
    assert train[:2] == ["shape00_0001", "shape00_0002"] and len(train) == 6
    assert test == ["shape00_0003", "shape01_0003", "shape02_0003"]
    # the loader's own reading: the class is the id less its last part, the file <class>/<id>.txt
    for shape in train + test:
        points = np.loadtxt(root / "_".join(shape.split("_")[:-1]) / f"{shape}.txt", delimiter=",")
        assert points.shape == (50, 6)
        assert np.allclose(np.linalg.norm(points[:, 3:], axis=1), 1.0, atol=1e-4)
    assert "already there" in prepare.prepare(step, tmp_path)


def test_generated_interactions_are_user_item_lines_each_users_together(tmp_path: Path) -> None:
    step = {"kind": "interactions", "dest": "{src}/data", "file": "x.txt", "users": 30, "items": 40, "mean": 8}
    prepare.prepare(step, tmp_path)
    pairs = [tuple(map(int, line.split(" "))) for line in (tmp_path / "data" / "x.txt").read_text().splitlines()]
    users = [u for u, _ in pairs]
    assert users == sorted(users) and set(users) == set(range(1, 31))
    assert all(1 <= i <= 40 for _, i in pairs)
    for user in range(1, 31):
        history = [i for u, i in pairs if u == user]
        assert 5 <= len(history) <= 20 and len(history) == len(set(history))
    first = (tmp_path / "data" / "x.txt").read_text()
    prepare.prepare(dict(step, dest="{src}/again"), tmp_path)
    assert (tmp_path / "again" / "x.txt").read_text() == first  # seeded: the same on every machine


def test_generated_json_lines_hold_one_text_each(tmp_path: Path) -> None:
    step = {
        "kind": "jsonl-text",
        "dest": "{src}/dataset",
        "file": "p.jsonl",
        "lines": 40,
        "min_words": 3,
        "max_words": 9,
    }
    prepare.prepare(step, tmp_path)
    first = (tmp_path / "dataset" / "p.jsonl").read_text()
    rows = [json.loads(line) for line in first.splitlines()]
    assert len(rows) == 40 and all(list(row) == ["text"] for row in rows)
    assert all(3 <= len(row["text"].split()) <= 9 and row["text"].endswith(".") for row in rows)
    assert all(row["text"][0].isupper() for row in rows)
    prepare.prepare(dict(step, dest="{src}/again"), tmp_path)
    assert (tmp_path / "again" / "p.jsonl").read_text() == first  # seeded: the same on every machine


def test_generated_segmentation_is_in_pascal_vocs_layout(tmp_path: Path) -> None:
    from PIL import Image

    step = {"kind": "voc-segmentation", "dest": "{src}/voc", "train": 3, "val": 2, "width": 120, "height": 90}
    prepare.prepare(step, tmp_path)
    root = tmp_path / "voc" / "VOC2012"
    splits = {s: (root / "ImageSets" / "Segmentation" / f"{s}.txt").read_text().split() for s in ("train", "val")}
    assert len(splits["train"]) == 3 and len(splits["val"]) == 2 and not set(splits["train"]) & set(splits["val"])
    for name in splits["train"] + splits["val"]:
        image = Image.open(root / "JPEGImages" / f"{name}.jpg")
        mask = Image.open(root / "SegmentationClass" / f"{name}.png")
        assert image.size == mask.size == (120, 90) and image.mode == "RGB" and mask.mode == "P"
        labels = set(np.unique(np.array(mask)).tolist())
        # the background, at least one object's class, its border marked 255 as VOC's are
        assert {0, 255} <= labels and labels - {0, 255} and max(labels - {255}) < 21
    assert "already there" in prepare.prepare(step, tmp_path)


def _script_entry(**fields: object) -> corpus.Script:
    """A manifest entry of one file ``t.py`` in a repository ``o/r``, its ``fields`` as given."""
    defaults: dict = {
        "name": "t",
        "repo": corpus.Repo("o/r", "a" * 40, "MIT", ("t.py",)),
        "path": "t.py",
        "domain": "x",
        "kind": "plain",
        "half": "calibration",
        "args": (),
        "cpu_args": None,
        "cpu_skip": None,
        "cwd": ".",
    }
    return corpus.Script(**{**defaults, **fields})


def test_a_scripts_arguments_get_its_folder_and_the_gpus_it_is_given(tmp_path: Path) -> None:
    script = _script_entry(
        half="holdout4",
        args=("--gpu", "{cuda_visible_devices}", "--data", "{src}/d"),
        cpu_args=("--data", "{src}/d", "--gpu", "{cuda_visible_devices}"),
    )
    assert zoo_run.script_arguments(script, tmp_path, False, {"CUDA_VISIBLE_DEVICES": "2"}) == [
        "--gpu",
        "2",
        "--data",
        f"{tmp_path}/d",
    ]
    assert zoo_run.script_arguments(script, tmp_path, False, {})[:2] == ["--gpu", "0"]
    # the smoke check hides CUDA (an empty variable): the script is still named a device it can set
    assert zoo_run.script_arguments(script, tmp_path, True, {"CUDA_VISIBLE_DEVICES": ""})[-1] == "0"


# ------------------------------------------------------------------ what run.py reads of a report


def test_a_findings_interval_and_measurement_are_read_in_any_shape() -> None:
    assert zoo_run._interval({"predicted_interval": [1.2, 1.8]}) == [1.2, 1.8]
    assert zoo_run._interval({"interval": {"low": 1.1, "high": 1.3}}) == [1.1, 1.3]
    assert zoo_run._interval({"predicted_speedup": 1.4}) is None
    assert zoo_run._measured({"measured": {"speedup": 2.02, "spread": 0.03}}) == 2.02
    assert zoo_run._measured({"measured": True, "measured_speedup": 1.5}) == 1.5
    assert zoo_run._measured({"measured": None}) is None


def test_only_runs_the_scripts_named_in_the_order_named() -> None:
    half = corpus.load().half("holdout5")
    names = [s.name for s in half]
    assert [s.name for s in zoo_run.select_scripts(half, [names[-1], names[0]])] == [names[-1], names[0]]
    assert [s.name for s in zoo_run.select_scripts(half, None)] == names


def test_verify_measures_the_top_the_runs_named_then_the_first_runs_next_findings() -> None:
    """The corpus scores the top a user is told: the rule most runs led with (of a tie, the
    earliest run's), then the first run's next findings up to ``--verify-top``; nothing asked
    where no run named a top (verify then ranks for itself)."""
    runs = [
        {"top": "LAUNCH001", "findings": [{"rule": "LAUNCH001"}, {"rule": "DATA005"}, {"rule": "SYNC001"}]},
        {"top": "DATA005", "findings": [{"rule": "DATA005"}]},
        {"top": "DATA005", "findings": [{"rule": "DATA005"}, {"rule": "LAUNCH001"}]},
    ]
    assert zoo_run.runs_top_rules(runs, 1) == ["DATA005"]
    assert zoo_run.runs_top_rules(runs, 3) == ["DATA005", "LAUNCH001", "SYNC001"]
    assert zoo_run.runs_top_rules(runs[:2], 1) == ["LAUNCH001"]  # a tie: the earlier run's
    assert zoo_run.runs_top_rules([{"top": None}, {"top": None}], 2) == []
    assert zoo_run.runs_top_rules(runs, 0) == []


def test_verify_summary_takes_each_recommendation_row_with_its_findings_interval() -> None:
    report = {
        "findings": [
            {"rule": "DATA001", "predicted_speedup": 1.53, "predicted_interval": [1.3, 1.9]},
            {"rule": "PREC001", "predicted_speedup": 1.2, "model_weakness": "the host runs ahead"},
        ],
        "experiments": {
            "baseline_spread": 0.04,
            "baseline_spread_from": "blocks",
            "rows": [
                {"role": "baseline", "label": "baseline", "speedup": 1.0},
                {
                    "role": "recommendation",
                    "rule": "DATA001",
                    "knobs": {"num_workers": 15},
                    "speedup": 2.02,
                    "predicted_speedup": 1.53,
                    "verdict": "helped",
                },
                {
                    "role": "recommendation",
                    "rule": "PREC001",
                    "knobs": {"autocast": "bf16"},
                    "speedup": 1.01,
                    "verdict": "no effect",
                },
            ],
        },
    }
    summary = zoo_run.verify_summary(report)
    assert summary["top"] == "DATA001" and summary["baseline_spread"] == 0.04
    assert summary["rows"] == [
        {
            "rule": "DATA001",
            "knobs": {"num_workers": 15},
            "status": None,
            "verdict": "helped",
            "measured": 2.02,
            "predicted": 1.53,
            "interval": [1.3, 1.9],
            "weak": None,
            "via": None,
        },
        {
            "rule": "PREC001",
            "knobs": {"autocast": "bf16"},
            "status": None,
            "verdict": "no effect",
            "measured": 1.01,
            "predicted": 1.2,
            "interval": None,
            "weak": "the host runs ahead",
            "via": None,
        },
    ]


def test_a_torchrun_script_gets_one_process_of_torchruns_variables(tmp_path: Path) -> None:
    script = _script_entry(kind="ddp", cpu_skip="gpu", env={"PYTHONPATH": "{src}/lib"}, launcher="torchrun")
    env = zoo_run.script_env(script, tmp_path, cpu=True)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("0", "0", "1")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO), f"{tmp_path}/lib"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""


# ------------------------------------------------------------------ run.py end to end (CPU)


def test_the_runner_goes_on_past_a_failing_script_and_records_each_as_it_finishes(tmp_path: Path) -> None:
    src = tmp_path / "scripts" / "o+r"
    src.mkdir(parents=True)
    commit = "b" * 40
    (src / ".zoo-commit").write_text(f"{commit} test\n")
    (src / "broken.py").write_text("raise SystemExit('no data here')\n")
    (src / "train.py").write_text(
        textwrap.dedent(
            """
        import sys
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        data = DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=8)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(int(sys.argv[1])):
            for x, y in data:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        """
        )
    )
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""
        [repos."o/r"]
        commit = "{commit}"
        licence = "MIT"
        include = ["train.py", "broken.py"]

        [[script]]
        name = "broken"
        repo = "o/r"
        path = "broken.py"
        domain = "tabular"
        kind = "plain"
        cpu_args = []
        half = "calibration"

        [[script]]
        name = "linear"
        repo = "o/r"
        path = "train.py"
        domain = "tabular"
        kind = "plain"
        cpu_args = ["4"]
        half = "calibration"
        """
        )
    )
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            str(ZOO / "run.py"),
            "--scripts",
            str(tmp_path / "scripts"),
            "--out",
            str(out),
            "--half",
            "all",
            "--cpu-smoke",
            "--manifest",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    records = [json.loads(line) for line in (out / "smoke.jsonl").read_text().splitlines()]
    assert [(r["name"], r["smoke"]) for r in records] == [("broken", "failed"), ("linear", "passed")]
    assert "no data here" in records[0]["error"]
    assert records[1]["runs"][0]["exit_code"] == 0 and any((out / "runs" / "linear" / "run0").rglob("report.json"))


# ------------------------------------------------------------------ score.py


def _record(
    name: str, half: str, tops: list[str | None], top: str | None, spread: float, rows: list[dict], **extra
) -> dict:
    runs = [{"top": t} for t in tops]
    return {
        "name": name,
        "half": half,
        "status": "ok",
        "runs": runs,
        "verify": {"top": top, "baseline_spread": spread, "rows": rows},
        **extra,
    }


RESULTS = [
    _record(
        "a",
        "evaluation",
        ["PREC001"] * 3,
        "PREC001",
        0.05,
        [
            {"rule": "PREC001", "measured": 2.0, "predicted": 2.2, "interval": [1.8, 2.4]},
            {"rule": "DATA001", "measured": 1.2, "predicted": 1.5, "interval": [1.3, 1.7]},
        ],
    ),
    _record(
        "b",
        "evaluation",
        ["DATA001", "LAUNCH001", "DATA001"],
        "DATA001",
        0.10,
        [
            {"rule": "DATA001", "measured": 0.85, "predicted": 1.3, "interval": None},
        ],
    ),
    _record("c", "evaluation", [None, None], None, 0.02, []),
    # d: the line after its runs, then the one after verify (the last counts)
    {
        "name": "d",
        "half": "evaluation",
        "status": "ok",
        "phase": "runs",
        "runs": [{"top": "COMP001"}] * 3,
        "verify": None,
    },
    _record(
        "d",
        "evaluation",
        ["COMP001"] * 3,
        "COMP001",
        0.04,
        [
            {"rule": "COMP001", "measured": 1.02, "predicted": 1.0, "interval": [0.95, 1.1]},
        ],
    ),
    # e: one run failed; the two left agree; verify's top had no knob to apply
    {
        "name": "e",
        "half": "evaluation",
        "status": "ok",
        "runs": [{"top": "SYNC001"}, {"exit_code": 1, "error": "boom"}, {"top": "SYNC001"}],
        "verify": {"top": "DATA004", "baseline_spread": 0.03, "rows": []},
    },
    _record(
        "f",
        "calibration",
        ["MEM004"] * 3,
        "MEM004",
        0.0,
        [
            {"rule": "MEM004", "measured": 3.0, "predicted": 3.0, "interval": [2.5, 3.5]},
        ],
    ),
    {
        "name": "g",
        "half": "calibration",
        "status": "failed",
        "error": "timed out",
        "runs": [{"exit_code": None, "error": "timed out"}],
        "verify": None,
    },
]


def test_score_on_a_hand_written_results_file() -> None:
    result = score.score(RESULTS)
    ev, cal = result["halves"]["evaluation"], result["halves"]["calibration"]
    errors = sorted([0.2 / 2.0, 0.3 / 1.2, 0.45 / 0.85, 0.02 / 1.02])
    assert ev["scripts"] == 5 and ev["failed"] == 0
    assert (ev["top_measured"], ev["helps_count"], ev["slower"], ev["no_effect"]) == (3, 1, 1, 1)
    assert ev["helps"] == pytest.approx(1 / 3)
    assert (ev["no_finding"], ev["not_measured"]) == (1, 1)
    assert ev["predicted_rows"] == 4
    assert ev["median_error"] == pytest.approx((errors[1] + errors[2]) / 2)
    assert ev["p90_error"] == pytest.approx(errors[2] + 0.7 * (errors[3] - errors[2]))
    assert (ev["inside_count"], ev["interval_rows"]) == (2, 3)
    assert (ev["stable_count"], ev["rerun_scripts"]) == (4, 5)  # b changed; c is "none" twice; e's two runs agree
    assert ev["met"] == {
        "helps": False,
        "slower": False,
        "median_error": False,
        "p90_error": False,
        "inside": False,
        "stable": False,
    }
    assert (
        cal["scripts"],
        cal["failed"],
        cal["top_measured"],
        cal["helps"],
        cal["median_error"],
        cal["p90_error"],
    ) == (2, 1, 1, 1.0, 0.0, 0.0)
    assert (cal["inside"], cal["rerun_scripts"], cal["stable"]) == (1.0, 1, 1.0)
    assert cal["met"] == {
        "helps": True,
        "slower": True,
        "median_error": True,
        "p90_error": True,
        "inside": True,
        "stable": True,
    }


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    assert score.percentile([4.0], 0.9) == 4.0
    assert score.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.9) == 10.0
    assert score.percentile([0.0, 1.0], 0.9) == pytest.approx(0.9)


def test_score_cli_prints_both_halves_side_by_side_and_writes_json(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in RESULTS))
    p = subprocess.run(
        [sys.executable, str(ZOO / "score.py"), str(results)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "| goal | calibration | evaluation | target |"
    assert (
        lines[2]
        == "| top recommendation helps beyond the baseline's spread | 1/1 (100%) (met) | 1/3 (33%) (not met) | >= 90% |"
    )
    assert lines[7] == "| same top finding on every rerun | 1/1 (100%) (met) | 4/5 (80%) (not met) | >= 90% |"
    assert "| b | evaluation | DATA001, LAUNCH001, DATA001 | DATA001 | 1.30x | - | 0.85x | 10% | slower |" in lines
    saved = json.loads((tmp_path / "score.json").read_text())
    assert saved["halves"]["evaluation"]["slower"] == 1


def test_resume_skips_only_the_scripts_whose_last_record_is_whole(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"name": "a", "status": "ok", "phase": "runs"},
                {"name": "a", "status": "ok"},  # runs, then verify
                {"name": "b", "status": "ok", "phase": "runs"},  # cut short during verify
                {"name": "c", "status": "skipped", "error": "budget"},
                {"name": "d", "status": "failed"},
            ]
        )
    )
    assert zoo_run.finished(results) == {"a", "d"}
    assert zoo_run.finished(tmp_path / "none.jsonl") == set()


def test_the_holdout_group_is_scored_in_a_column_of_its_own_where_a_run_holds_it() -> None:
    plain = score.markdown(score.score(RESULTS))
    assert plain.splitlines()[0] == "| goal | calibration | evaluation | target |"
    held = _record(
        "h",
        "holdout",
        ["DATA001"] * 3,
        "DATA001",
        0.05,
        [{"rule": "DATA001", "measured": 1.5, "predicted": 1.6, "interval": [1.3, 1.9]}],
    )
    result = score.score([*RESULTS, held])
    assert list(result["halves"]) == ["calibration", "evaluation", "holdout"]
    assert result["halves"]["holdout"]["helps_count"] == 1
    lines = score.markdown(result).splitlines()
    assert lines[0] == "| goal | calibration | evaluation | holdout | target |"
    assert lines[1] == "|---|---|---|---|---|"


# ------------------------------------------------------------------ calibrate.py


def _calibration_record(name: str, half: str, rows: list[dict]) -> dict:
    return {"name": name, "half": half, "verify": {"rows": rows}}


PREDICTS = {"DATA001": "more_workers", "MEM001": "larger_batch", "LAUNCH001": "cuda_graphs"}


def test_a_rows_error_is_log_symmetric() -> None:
    assert calibrate.row_error(2.0, 1.0) == pytest.approx(1.0)  # 2x too high
    assert calibrate.row_error(1.0, 2.0) == pytest.approx(1.0)  # 2x too low
    assert calibrate.row_error(1.8, 1.5) == pytest.approx(0.2)
    # what the run-to-run term covers at the edge is taken off in quadrature: 2x off with a
    # rerun CV whose edge (1.645 * sqrt(2) * cv) is ln 2 * 0.6 leaves ln 2 * 0.8 to the model
    import math

    cv = math.log(2) * 0.6 / (1.645 * math.sqrt(2))
    assert calibrate.row_error(2.0, 1.0, cv) == pytest.approx(2**0.8 - 1)
    assert calibrate.row_error(1.1, 1.0, cv) == 0.0  # the rerun alone covers it


def test_the_conformal_edge_is_the_largest_under_nine_rows_and_a_rank_beyond() -> None:
    assert calibrate.conformal_edge([0.3, 0.1, 0.2]) == 0.3
    # n = 19: rank ceil(20 * 0.9) = 18 of 19
    errors = [i / 100 for i in range(1, 20)]
    assert calibrate.conformal_edge(errors) == pytest.approx(0.18)


def test_fit_reads_only_the_calibration_half_and_fits_each_side_past_the_examples() -> None:
    from diagnose.analysis.prediction.uncertainty import MODEL_ERROR

    records = [
        _calibration_record(
            "a",
            "calibration",
            [
                {"rule": "DATA001", "predicted": 2.0, "measured": 2.5},  # 25% up
                {"rule": "MEM001", "predicted": 1.1, "measured": 1.0},  # 10% down, under the examples' 19%
                {"rule": "DATA005", "predicted": None, "measured": 1.2},  # nothing predicted
                {"rule": "LAUNCH001", "predicted": 3.0, "measured": None},  # not measured
                {"rule": "LAUNCH001", "predicted": 3.0, "measured": 1.0, "weak": "graph breaks"},
            ],
        ),
        _calibration_record("b", "calibration", [{"rule": "DATA001", "predicted": 1.0, "measured": 2.0}]),  # 100% up
        _calibration_record("e", "calibration", [{"rule": "DATA001", "predicted": 1.5, "measured": 1.0}]),  # 50% down
        _calibration_record("c", "evaluation", [{"rule": "DATA001", "predicted": 9.0, "measured": 1.0}]),
        _calibration_record("d", "holdout", [{"rule": "MEM001", "predicted": 9.0, "measured": 1.0}]),
    ]
    result = calibrate.fit(records, PREDICTS)
    assert set(result) == {"more_workers", "larger_batch", "cuda_graphs"}
    workers = result["more_workers"]
    assert [r["script"] for r in workers["rows"]] == ["a", "b", "e"]
    # each side: the largest of its own misses (fewer than 19 rows), the other side's rows at 0
    assert workers["upside_edge"] == pytest.approx(1.0) and workers["downside_edge"] == pytest.approx(0.5)
    assert workers["upside"] == pytest.approx(1.0) and workers["downside"] == pytest.approx(0.5)
    assert workers["largest_rank"] and workers["examples"] == MODEL_ERROR["more_workers"]
    batch = result["larger_batch"]
    assert batch["downside_edge"] == pytest.approx(0.1) and batch["upside_edge"] == 0.0
    assert batch["upside"] is None and batch["downside"] is None  # never below the examples'
    graphs = result["cuda_graphs"]  # a weak compile's row has its own downside
    assert graphs["rows"] == [] and graphs["left_weak"] == 1 and graphs["upside_edge"] is None
    assert "| more_workers | a DATA001: 2.00x -> 2.50x, 25%; b DATA001: 1.00x -> 2.00x, 100%; e DATA001" in (
        calibrate.markdown(result)
    )
    # a run-to-run term takes its share of each miss first
    rerun = calibrate.fit(records, PREDICTS, lambda record: 0.1)["more_workers"]
    assert rerun["upside_edge"] == pytest.approx(calibrate.row_error(1.0, 2.0, 0.1))


def test_calibrate_cli_takes_the_last_record_of_each_script_per_file(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    runs_only = {"name": "a", "half": "calibration", "phase": "runs"}
    whole = _calibration_record("a", "calibration", [{"rule": "DATA001", "predicted": 2.0, "measured": 2.5}])
    results.write_text(json.dumps(runs_only) + "\n" + json.dumps(whole) + "\n")
    out = subprocess.run(
        [sys.executable, str(ZOO / "calibrate.py"), str(results), "--json", str(tmp_path / "fit.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "| more_workers | a DATA001: 2.00x -> 2.50x, 25%" in out.stdout
    gone = subprocess.run(
        [sys.executable, str(ZOO / "calibrate.py"), str(tmp_path / "nothing.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gone.returncode == 2 and gone.stderr.strip() == f"error: {tmp_path / 'nothing.jsonl'}: no such file"
    saved = json.loads((tmp_path / "fit.json").read_text())
    assert saved["model_error"]["more_workers"]["upside_edge"] == pytest.approx(0.25)
    assert saved["run_to_run"] == {"host": None, "scripts": []}  # one run: no spread to fit


def test_the_run_to_run_fit_is_the_pooled_spread_where_every_script_is_host_paced() -> None:
    """Two host-paced scripts (host share 1): log steps/s spreads of 10% over 3 runs and 20% over
    2; the likeliest host-paced CV is the pooled one, sqrt((2 * 0.01 + 1 * 0.04) / 3) = 14.1%.
    A script of one run says nothing."""
    import math

    scripts = {
        "a": [(math.exp(v), 1.0) for v in (0.0, 0.1, 0.2)],
        "b": [(math.exp(v), 1.0) for v in (0.0, 0.2 * math.sqrt(2))],
        "c": [(5.0, 1.0)],
    }
    rerun = calibrate.fit_run_to_run(scripts)
    assert [r["script"] for r in rerun["scripts"]] == ["a", "b"]
    assert rerun["scripts"][0]["cv"] == pytest.approx(0.1) and rerun["scripts"][1]["cv"] == pytest.approx(0.2)
    assert rerun["host"] == pytest.approx(0.141)
    # a GPU-paced script that moved 1% says the host-paced value is whatever the others say
    with_gpu = calibrate.fit_run_to_run({**scripts, "d": [(100.0, 0.0), (101.0, 0.0)]})
    assert with_gpu["host"] == pytest.approx(0.141)
    assert calibrate.fit_run_to_run({"c": [(5.0, 1.0)]})["host"] is None


def test_an_older_record_is_upgraded_from_its_reports_and_steady_runs_are_its_diagnose_runs(
    tmp_path: Path,
) -> None:
    import io
    import tarfile

    record = {
        "name": "s",
        "half": "calibration",
        "runs": [
            {"run_dir": "/tmp/x/runs/s/run0", "steps_per_s": 10.0, "host_share": 0.9},
            {"run_dir": "/tmp/x/runs/s/run1"},  # an older record: its figures in the reports
            {"error": "timed out"},
        ],
        "verify": {"rows": [{"rule": "LAUNCH001", "predicted": 2.0, "measured": 0.8}]},
    }
    assert calibrate.steady_runs(record) == [(10.0, 0.9)]
    tgz = tmp_path / "reports.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for run, rate, share in (("run1", 12.0, 0.8), ("verify", 11.0, 0.85)):
            report = {"throughput": {"steady": {"steps_per_s": rate}}, "symptoms": {"exposed.host": {"value": share}}}
            if run == "verify":
                report["findings"] = [{"rule": "LAUNCH001", "model_weakness": "graph breaks"}]
            data = json.dumps(report).encode()
            info = tarfile.TarInfo(f"./lane1/runs/s/{run}/diagnose/report.json")  # a lane's folder
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    upgraded = calibrate.upgrade(record, calibrate.Reports(tgz))
    assert record["runs"][1] == {"run_dir": "/tmp/x/runs/s/run1"}  # the record read is left as it was
    assert calibrate.steady_runs(upgraded) == [(10.0, 0.9), (12.0, 0.8)]  # verify's baseline is no rerun
    assert (upgraded["verify"]["steps_per_s"], upgraded["verify"]["host_share"]) == (11.0, 0.85)
    assert upgraded["verify"]["rows"][0]["weak"] == "graph breaks"
    assert calibrate.rerun_term(upgraded, 0.2) == pytest.approx(0.01 + 0.19 * 0.85)
    assert calibrate.rerun_term(record, 0.2) == 0.0 and calibrate.rerun_term(upgraded, None) == 0.0
    assert zoo_run.host_share({"symptoms": {"exposed.host": {"value": 0.5}}}) == 0.5
    assert zoo_run.host_share({}) is None


def test_the_runs_stated_figure_is_their_checks_measurement_where_they_measured() -> None:
    """Three runs of one script whose top verify measured 2.0x: one measured it in-run at 2.4x
    (a rerun 1.8-3.0x: holds 2.0), one predicted 1.5x (1.2-1.8x: misses), one named another top."""
    record = {
        "name": "s",
        "half": "evaluation",
        "status": "ok",
        "runs": [
            {
                "top": "DATA001",
                "top_finding": {
                    "rule": "DATA001",
                    "basis": "measured",
                    "measured": 2.4,
                    "predicted": 1.5,
                    "measured_interval": [1.8, 3.0],
                },
            },
            {
                "top": "DATA001",
                "top_finding": {"rule": "DATA001", "basis": "predicted", "predicted": 1.5, "interval": [1.2, 1.8]},
            },
            {"top": "MEM001", "top_finding": {"rule": "MEM001", "basis": "predicted", "predicted": 3.0}},
        ],
        "verify": {
            "top": "DATA001",
            "baseline_spread": 0.05,
            "rows": [{"rule": "DATA001", "measured": 2.0, "predicted": 1.5}],
        },
    }
    o = score.outcome(record)
    assert o["stated"] == [
        {"measured_in_run": True, "error": pytest.approx(0.2), "inside": True},
        {"measured_in_run": False, "error": pytest.approx(0.25), "inside": False},
    ]
    s = score.summarize([o])
    assert (s["stated_runs"], s["stated_measured"], s["stated_inside_count"], s["stated_interval_runs"]) == (2, 1, 1, 2)
    assert s["stated_median_error"] == pytest.approx(0.225)
    row = "| as the runs state it: verify's figure inside the run's interval | 0/0 (-) | 1/2 (50%) | (no goal) |"
    assert row in score.markdown(score.score([record]))

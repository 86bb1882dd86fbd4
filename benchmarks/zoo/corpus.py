"""The outside corpus's manifest: load it, check it, and split it into halves.

Contract: ``load(path) -> Corpus`` reads ``manifest.toml`` into typed values (each script with
its repository's commit and licence resolved); ``problems(corpus) -> list[str]`` says what is
wrong with it (empty: nothing); ``split_halves(counts) -> dict[repo, half]`` is the split rule,
a pure function of the repository names and how many scripts each has, so that the halves
recorded in the manifest can be checked against it. Nothing here runs a script.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # diagnose depends on tomli there
    import tomli as tomllib

MANIFEST = Path(__file__).with_name("manifest.toml")
HALVES = ("calibration", "evaluation")
#: the groups of repositories added after the split, each a table of the manifest of its name
#: (``[holdout]``, ``[holdout2]``, ... ``[holdout5]``), in the order they came: each run once, for its score, with
#: nothing changed for it before it (docs/zoo.md). A group run once is in sample for whatever
#: changed after it: the next one measures that.
HOLDOUT = "holdout"
HOLDOUTS = (HOLDOUT, "holdout2", "holdout3", "holdout4", "holdout5")
GROUPS = (*HALVES, *HOLDOUTS)
KINDS = ("plain", "lightning", "fabric", "hf-trainer", "accelerate", "ignite", "compiled", "ddp", "fsdp")
PREPARE_KINDS = (
    "mnist",
    "text",
    "lines",
    "tokens",
    "images",
    "cifar-pt",
    "timm-hub-weights",
    "folder",
    "citation-graph",
    "point-clouds",
    "interactions",
    "jsonl-text",
    "voc-segmentation",
)
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Repo:
    name: str  # owner/name on GitHub
    commit: str
    licence: str  # SPDX identifier, read from the repository's LICENSE
    include: tuple[str, ...]  # git pathspecs fetched

    @property
    def slug(self) -> str:
        """The repository's folder under the fetched tree: owner+name, as the mirrors name it."""
        return self.name.replace("/", "+")


@dataclass(frozen=True)
class Script:
    name: str
    repo: Repo
    path: str  # the script, relative to the repository's root
    domain: str
    kind: str
    half: str
    args: tuple[str, ...]
    cpu_args: tuple[str, ...] | None  # None: no CPU variant (cpu_skip says why)
    cpu_skip: str | None
    cwd: str  # relative to the repository's root
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = "python"  # or "torchrun" (one process)
    prepare: tuple[dict, ...] = ()
    gpu_s: float = 0.0

    @property
    def commit(self) -> str:
        return self.repo.commit

    @property
    def licence(self) -> str:
        return self.repo.licence


@dataclass(frozen=True)
class Corpus:
    repos: dict[str, Repo]
    scripts: list[Script]
    split_rule: str
    #: the repositories of every holdout group, outside the split
    holdout_repos: tuple[str, ...] = ()
    #: each holdout group's repositories
    holdout_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def half(self, which: str) -> list[Script]:
        return [s for s in self.scripts if which == "all" or s.half == which]


def load(path: Path = MANIFEST) -> Corpus:
    data = tomllib.loads(path.read_text())
    repos = {
        name: Repo(name, r["commit"], r["licence"], tuple(r.get("include", ())))
        for name, r in data.get("repos", {}).items()
    }
    scripts = []
    for s in data.get("script", []):
        repo = repos.get(s["repo"]) or Repo(s["repo"], "", "", ())
        cwd = s.get("cwd") or str(Path(s["path"]).parent)
        scripts.append(
            Script(
                name=s["name"],
                repo=repo,
                path=s["path"],
                domain=s.get("domain", ""),
                kind=s.get("kind", ""),
                half=s.get("half", ""),
                args=tuple(s.get("args", ())),
                cpu_args=tuple(s["cpu_args"]) if "cpu_args" in s else None,
                cpu_skip=s.get("cpu_skip"),
                cwd=cwd,
                env=dict(s.get("env", {})),
                launcher=s.get("launcher", "python"),
                prepare=tuple(s.get("prepare", ())),
                gpu_s=float(s.get("gpu_s", 0)),
            )
        )
    groups = {group: tuple(data.get(group, {}).get("repos", ())) for group in HOLDOUTS if group in data}
    holdout = tuple(repo for repos_of in groups.values() for repo in repos_of)
    return Corpus(repos, scripts, data.get("split", {}).get("rule", ""), holdout, groups)


def split_halves(counts: dict[str, int]) -> dict[str, str]:
    """The split rule: repositories with the most scripts first (equal counts in the order of the
    sha256 of their name), each to the half with fewer scripts so far (a tie: calibration).
    Fixed before anything was tuned; by repository, so that no half shares a codebase's habits
    with the other; largest first, so that the halves come out about the same size."""
    order = sorted(counts, key=lambda name: (-counts[name], hashlib.sha256(name.encode()).hexdigest()))
    total = {half: 0 for half in HALVES}
    halves = {}
    for name in order:
        half = "calibration" if total["calibration"] <= total["evaluation"] else "evaluation"
        halves[name] = half
        total[half] += counts[name]
    return halves


def problems(corpus: Corpus) -> list[str]:
    """Everything the manifest must hold (issue 32, item 4); empty when it holds."""
    out = []
    for name, repo in corpus.repos.items():
        if "/" not in name:
            out.append(f"repository {name!r}: not owner/name")
        if not COMMIT_RE.match(repo.commit):
            out.append(f"repository {name}: commit {repo.commit!r} is not 40 hex digits")
        if not repo.licence:
            out.append(f"repository {name}: no licence")
        if not repo.include:
            out.append(f"repository {name}: nothing to fetch (include)")
    seen = set()
    for s in corpus.scripts:
        where = f"script {s.name}"
        if s.name in seen:
            out.append(f"{where}: named twice")
        seen.add(s.name)
        if not NAME_RE.match(s.name):
            out.append(f"{where}: name is not lower-case letters, digits and dashes")
        if s.repo.name not in corpus.repos:
            out.append(f"{where}: repository {s.repo.name} has no [repos] entry")
        for label, value in (("path", s.path), ("domain", s.domain), ("kind", s.kind)):
            if not value:
                out.append(f"{where}: no {label}")
        if s.kind and s.kind not in KINDS:
            out.append(f"{where}: kind {s.kind!r} not one of {', '.join(KINDS)}")
        if s.half not in GROUPS:
            out.append(f"{where}: half {s.half!r} not one of {', '.join(GROUPS)}")
        elif s.half in HOLDOUTS and s.repo.name not in corpus.holdout_groups.get(s.half, ()):
            out.append(f"{where}: half {s.half}, but [{s.half}] does not list {s.repo.name}")
        elif group := next((g for g, r in corpus.holdout_groups.items() if s.repo.name in r and g != s.half), None):
            out.append(f"{where}: half {s.half}, but {s.repo.name} is in the {group} group")
        if s.cpu_args is None and not s.cpu_skip:
            out.append(f"{where}: neither cpu_args nor cpu_skip")
        if s.launcher not in ("python", "torchrun"):
            out.append(f"{where}: launcher {s.launcher!r}")
        for step in s.prepare:
            if step.get("kind") not in PREPARE_KINDS:
                out.append(f"{where}: prepare kind {step.get('kind')!r} not one of {', '.join(PREPARE_KINDS)}")
            if not str(step.get("dest", "")).startswith("{src}"):
                out.append(f"{where}: prepare dest {step.get('dest')!r} outside the fetched repository")
    counts: dict[str, int] = {}
    split = [s for s in corpus.scripts if s.half in HALVES and s.repo.name not in corpus.holdout_repos]
    for s in split:  # the holdout group is outside the split, made before it came
        counts[s.repo.name] = counts.get(s.repo.name, 0) + 1
    rule = split_halves(counts)
    for s in split:
        if rule.get(s.repo.name) != s.half:
            out.append(f"script {s.name}: half {s.half}, the split rule gives {rule.get(s.repo.name)}")
    for half in HALVES:
        if not corpus.half(half):
            out.append(f"the {half} half is empty")
    return out

"""Fetch the outside corpus's scripts at their pinned commits, then generate their data.

    python benchmarks/zoo/fetch.py --dest zoo-scripts --mirror /work/.mirror   # from git mirrors
    python benchmarks/zoo/fetch.py --dest zoo-scripts                          # from GitHub archives
    python benchmarks/zoo/fetch.py --dest zoo-scripts --no-prepare             # sources only
    python benchmarks/zoo/fetch.py --dest zoo-scripts --prepare-only           # data only (no network)

Each repository of the manifest lands in DEST/<owner>+<name>/, only the paths its ``include``
lists. From a mirror (a git directory at MIRROR/<owner>+<name>/repo, MIRROR/<owner>+<name> or
MIRROR/<owner>+<name>.git) the files come out of the pinned commit itself (``git archive``), so
the commit is checked by construction; from a URL (GitHub's archive of that commit) the commit
id the archive states must be the pinned one. DEST/<owner>+<name>/.zoo-commit records it; a
folder whose record matches is not fetched again. Then each script's ``prepare`` steps run
(prepare.py: generated data only). DEST is never committed (.gitignore has /zoo-scripts/).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import corpus
import prepare

ARCHIVE_URL = "https://codeload.github.com/{repo}/tar.gz/{commit}"
RECORD = ".zoo-commit"


class FetchError(Exception):
    """A repository could not be fetched at its pinned commit (the message says why, in one line)."""


def fetched_commit(folder: Path) -> str | None:
    record = folder / RECORD
    return record.read_text().split()[0] if record.exists() else None


def fetched_include(folder: Path) -> list[str] | None:
    """The pathspecs the folder was fetched with (its record's second line)."""
    record = folder / RECORD
    lines = record.read_text().splitlines() if record.exists() else []
    return json.loads(lines[1]) if len(lines) > 1 else None


def find_mirror(mirror: Path, repo: corpus.Repo) -> Path | None:
    for candidate in (mirror / repo.slug / "repo", mirror / repo.slug, mirror / f"{repo.slug}.git"):
        if (
            candidate.is_dir()
            and subprocess.run(["git", "-C", str(candidate), "rev-parse", "--git-dir"], capture_output=True).returncode
            == 0
        ):
            return candidate
    return None


def _extract(tar: tarfile.TarFile, into: Path, strip: str, include: tuple[str, ...]) -> int:
    count = 0
    for member in tar.getmembers():
        name = member.name[len(strip) :] if strip and member.name.startswith(strip) else member.name
        if not name or not (member.isfile() or member.isdir()) or not wanted(name, include):
            continue
        member.name = name
        tar.extract(member, into, filter="data")
        count += member.isfile()
    return count


def wanted(path: str, include: tuple[str, ...]) -> bool:
    """Whether ``path`` is under one of the pathspecs (a folder, a file, or a glob whose ``*``
    crosses ``/``, as git's pathspecs do)."""
    return any(
        path == spec or path.startswith(spec.rstrip("/") + "/") or fnmatch.fnmatchcase(path, spec) for spec in include
    )


def from_mirror(git_dir: Path, repo: corpus.Repo, into: Path) -> int:
    if (
        subprocess.run(
            ["git", "-C", str(git_dir), "cat-file", "-e", f"{repo.commit}^{{commit}}"], capture_output=True
        ).returncode
        != 0
    ):
        raise FetchError(f"{repo.name}: the mirror {git_dir} has no commit {repo.commit}")
    # only the included paths: a snapshot may lack the large files of the commit
    p = subprocess.run(
        ["git", "-C", str(git_dir), "archive", "--format=tar", repo.commit, "--", *repo.include], capture_output=True
    )
    if p.returncode != 0:
        raise FetchError(f"{repo.name}: git archive failed: {p.stderr.decode(errors='replace').strip()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tar:
        return _extract(tar, into, "", repo.include)


def from_url(repo: corpus.Repo, into: Path, timeout: float = 120) -> int:
    url = ARCHIVE_URL.format(repo=repo.name, commit=repo.commit)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # a fixed https URL
            data = response.read()
    except OSError as e:
        raise FetchError(f"{repo.name}: {url}: {e}") from None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        stated = tar.pax_headers.get("comment", "").strip()
        if stated != repo.commit:
            raise FetchError(f"{repo.name}: the archive states commit {stated or '(none)'}, not {repo.commit}")
        top = tar.getmembers()[0].name.split("/")[0] + "/"
        return _extract(tar, into, top, repo.include)


def fetch_repo(repo: corpus.Repo, dest: Path, mirror: Path | None) -> str:
    folder = dest / repo.slug
    if fetched_commit(folder) == repo.commit and fetched_include(folder) == list(repo.include):
        return f"{repo.name}: {folder} already at {repo.commit[:12]}"
    staging = dest / f".{repo.slug}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    git_dir = find_mirror(mirror, repo) if mirror else None
    if git_dir is not None:
        count, source = from_mirror(git_dir, repo, staging), str(git_dir)
    else:
        count, source = from_url(repo, staging), "archive"
    missing = [spec for spec in repo.include if "*" not in spec and not (staging / spec).exists()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        raise FetchError(f"{repo.name}@{repo.commit[:12]}: not in the commit: {', '.join(missing)}")
    (staging / RECORD).write_text(f"{repo.commit} {source}\n{json.dumps(list(repo.include))}\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return f"{repo.name}: {count} files at {repo.commit[:12]} from {source} into {folder}"


def prepare_scripts(scripts: list[corpus.Script], dest: Path) -> list[str]:
    """Every ``prepare`` step of ``scripts`` whose repository is fetched; the errors, one line each."""
    errors = []
    for script in scripts:
        src = dest / script.repo.slug
        if fetched_commit(src) != script.commit:
            errors.append(f"{script.name}: {src} is not fetched at {script.commit[:12]}")
            continue
        for step in script.prepare:
            try:
                print(f"  {script.name}: {prepare.prepare(step, src)}", flush=True)
            except Exception as e:  # noqa: BLE001 - one script's data never stops the others'
                errors.append(f"{script.name}: prepare {step.get('kind')}: {type(e).__name__}: {e}")
    return errors


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", type=Path, required=True, help="the (ignored) folder to fetch into")
    p.add_argument("--mirror", type=Path, help="a folder of git mirrors, <owner>+<name>/repo")
    p.add_argument("--only", nargs="*", help="script names (default: all)")
    p.add_argument("--half", choices=[*corpus.GROUPS, "all"], default="all")
    p.add_argument("--manifest", type=Path, default=corpus.MANIFEST)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--no-prepare", action="store_true", help="fetch the sources only")
    group.add_argument("--prepare-only", action="store_true", help="generate the data of sources already fetched")
    args = p.parse_args()
    manifest = corpus.load(args.manifest)
    wrong = corpus.problems(manifest)
    if wrong:
        print(
            f"error: {args.manifest}: {wrong[0]}" + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""),
            file=sys.stderr,
        )
        return 2
    scripts = [s for s in manifest.half(args.half) if not args.only or s.name in args.only]
    unknown = set(args.only or ()) - {s.name for s in manifest.scripts}
    if unknown:
        print(f"error: no script named {', '.join(sorted(unknown))} in the manifest", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    errors = []
    if not args.prepare_only:
        for repo in {s.repo.name: s.repo for s in scripts}.values():
            try:
                print(fetch_repo(repo, args.dest, args.mirror), flush=True)
            except FetchError as e:
                errors.append(str(e))
                print(f"error: {e}", file=sys.stderr, flush=True)
    if not args.no_prepare:
        print("preparing data", flush=True)
        for line in prepare_scripts(scripts, args.dest):
            errors.append(line)
            print(f"error: {line}", file=sys.stderr, flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

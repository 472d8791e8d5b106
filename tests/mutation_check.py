"""Mutation check: the known-answer tests must fail on known-wrong metric and interval code.

    python3 tests/mutation_check.py            # exit 0: every mutant was killed

Copies the package and the tests to a temporary directory, checks that the known-answer
tests (tests/evalmode/test_known_answer.py) pass on the unmodified copy, then applies each
mutation below to a fresh copy and runs the same tests against it (PYTHONPATH, the
working directory and pytest's rootdir point at the copy, so the copy is what gets
imported: pytest puts the rootdir of the `tests` package first on sys.path). Exit status:
0 every mutant was killed; 1 a mutant survived, or the tests fail on unmodified code;
2 a mutation no longer applies (its text is not found exactly once: the code moved, so
update the mutation here rather than let the check pass vacuously).

The grid runs once, for the unmodified copy; the mutants reuse its trace
(OFFSCOPE_KNOWN_ANSWER_GRID), so every metric and interval is recomputed by mutated code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path("tests") / "evalmode" / "test_known_answer.py"  # inside the copy


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # inside the package copy
    old: str
    new: str


MUTATIONS = [
    Mutation(
        "acted counts prepare-stage calls",
        "offscope/trace/metrics.py",
        "    def acted(self) -> bool:\n        return self.reached >= 2\n",
        "    def acted(self) -> bool:\n        return self.reached >= 1\n",
    ),
    Mutation(
        "self-granted counted at any stage",
        "offscope/trace/metrics.py",
        'if stage == "act" and self._awaiting_grant_use:',
        "if self._awaiting_grant_use:",
    ),
    Mutation(
        "first out-of-scope step off by one",
        "offscope/trace/metrics.py",
        "            self.first_oos_step = step\n",
        "            self.first_oos_step = step + 1\n",
    ),
    Mutation(
        "Wilson interval 68% too wide",
        "offscope/trace/rates.py",
        "    half = z * (",
        "    half = 1.68 * z * (",
    ),
]


def copy_package(dest: Path) -> None:
    """The package, the tests (a package importing the package) and pytest's settings."""
    shutil.copytree(
        ROOT / "offscope", dest / "offscope", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    shutil.copytree(
        ROOT / "tests",
        dest / "tests",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"),
    )
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")


def apply(m: Mutation, root: Path) -> None:
    path = root / m.path
    text = path.read_text(encoding="utf-8")
    count = text.count(m.old)
    if count != 1:
        _die(
            f"mutation {m.name!r} does not apply: its text occurs {count} times in {m.path} (expected "
            f"once). The code moved: update MUTATIONS in {Path(__file__).name}.\n  text: {m.old!r}"
        )
    path.write_text(text.replace(m.old, m.new), encoding="utf-8")


def run_tests(pkg_root: Path, grid: Path) -> tuple[int, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(pkg_root),
        "OFFSCOPE_KNOWN_ANSWER_GRID": str(grid),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    probe = subprocess.run(
        [sys.executable, "-c", "import offscope; print(offscope.__file__)"],
        cwd=pkg_root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    imported = Path(probe.stdout.strip()).resolve()
    if pkg_root.resolve() not in imported.parents:
        _die(f"the copy is not what gets imported ({imported}); cannot test mutants")
    # The test that this file's mutations still apply reads the copy, mutated or not: a
    # mutant must be killed by the known answers, not by that test.
    skip = f"{TESTS}::test_the_mutation_check_still_applies_to_this_code"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            str(TESTS),
            "--deselect",
            skip,
            "--rootdir",
            str(pkg_root),
        ],
        cwd=pkg_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = [
        line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)
    ]
    return proc.returncode, (tail[-1] if tail else proc.stdout[-500:] + proc.stderr[-500:])


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="offscope-mutation-") as tmp:
        tmp_path = Path(tmp)
        grid = tmp_path / "grid"
        pristine = tmp_path / "pristine"
        copy_package(pristine)
        for m in MUTATIONS:  # fail loudly before spending a minute on the grid
            apply(m, _scratch(pristine, tmp_path / "dry"))
        code, summary = run_tests(pristine, grid)
        print(f"unmodified code: {summary}")
        if code != 0:
            print("mutation_check: the known-answer tests fail on unmodified code; fix them first")
            return 1
        survived = []
        for i, m in enumerate(MUTATIONS):
            mutant = _scratch(pristine, tmp_path / f"mutant{i}")
            apply(m, mutant)
            code, summary = run_tests(mutant, grid)
            # 1 = tests failed. Anything else (0 passed, 2+ collection or usage error) is not a kill.
            killed = code == 1
            print(f"mutant {m.name!r}: {'killed' if killed else 'SURVIVED'} ({summary})")
            if not killed:
                survived.append(m.name)
    print(
        f"mutation_check: {len(MUTATIONS) - len(survived)}/{len(MUTATIONS)} mutants killed "
        f"in {time.monotonic() - started:.0f}s"
    )
    return 1 if survived else 0


def _die(message: str) -> None:
    print(f"mutation_check: {message}", file=sys.stderr)
    sys.exit(2)


def _scratch(pristine: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(pristine, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


if __name__ == "__main__":
    sys.exit(main())

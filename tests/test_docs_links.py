"""The front door and the docs stay true: README.md and docs/*.md are checked for

- README length (a front door, at most 150 lines);
- every relative link and #anchor resolving to a file and a heading in this repository
  (deploy/**/README.md included);
- docs/index.md listing every page in docs/;
- no reference to documents outside the repository;
- every `offscope COMMAND --flag` in a shell block naming a real command and option;
- every YAML block that declares an offscope `schema:` validating with `offscope validate`;
- the README's test command being the one CI (.ci/run) runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from offscope.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# Other Markdown in the repository that users read: its links are checked too.
LINKED_PAGES = [*PAGES, *sorted((REPO / "deploy").rglob("README.md"))]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def code_blocks(text: str, langs: tuple[str, ...]) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang in langs]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            found.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return found


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, (
        f"README.md has {len(lines)} lines; move detail into docs/ (at most 150)"
    )


@pytest.mark.parametrize("page", LINKED_PAGES, ids=_rel)
def test_every_link_resolves(page: Path):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... are outside this check
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_rel(dest)}")
        elif REPO not in dest.parents and dest != REPO:
            broken.append(f"{target}: outside the repository")
    assert not broken, f"{_rel(page)}: broken links:\n" + "\n".join(broken)


def test_index_lists_every_page():
    index = (DOCS / "index.md").read_text()
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in LINK.findall(index)}
    missing = [
        p.name for p in DOCS.glob("*.md") if p.name != "index.md" and p.resolve() not in linked
    ]
    assert not missing, f"docs/index.md does not link {missing}; add a row for each page"
    assert "docs/index.md" in README.read_text(), "the README must link docs/index.md"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_reference_outside_the_repository(page: Path):
    """The repository stands alone: no relative path on a page, link or not
    (a code span, a prose mention), climbs out of it."""
    outside = [
        ref
        for ref in re.findall(r"(?:\.\./)+[\w.-][\w./-]*", page.read_text())
        if REPO not in (page.parent / ref).resolve().parents
    ]
    assert not outside, f"{_rel(page)} refers to files outside the repository: {outside}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """A command's options, with those of its actions (`offscope runs start --record`)."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _options(child)
    return found


def offscope_invocations(block: str) -> list[tuple[str, list[str]]]:
    """(command, --flags) for every `offscope COMMAND ...` in a shell block."""
    joined = block.replace("\\\n", " ")
    joined = re.sub(r"(^|\s)#.*", "", joined)  # shell comments: prose, not commands
    found = []
    for m in re.finditer(r"(?<![\w./-])offscope ([a-z][a-z-]*)([^\n|;&)#]*)", joined):
        flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2))
        found.append((m.group(1), flags))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_commands_in_shell_blocks_exist(page: Path):
    commands = _subcommands()
    wrong = []
    for block in code_blocks(page.read_text(), ("sh", "bash", "shell", "console")):
        for name, flags in offscope_invocations(block):
            if name not in commands:
                wrong.append(f"offscope {name}: no such command")
                continue
            known = _options(commands[name])
            wrong += [f"offscope {name} {f}: no such option" for f in flags if f not in known]
    assert not wrong, f"{_rel(page)}:\n" + "\n".join(wrong)


def test_readme_command_table_is_every_command():
    table = set(re.findall(r"^\| `offscope ([a-z-]+)` \|", README.read_text(), flags=re.M))
    assert table == set(_subcommands()), (
        f"README command table differs from `offscope --help`: missing {set(_subcommands()) - table}, "
        f"extra {table - set(_subcommands())}"
    )


def test_yaml_examples_validate(tmp_path: Path):
    files = []
    for page in PAGES:
        for i, block in enumerate(code_blocks(page.read_text(), ("yaml", "yml"))):
            if re.search(r"^schema: offscope\.", block, flags=re.M):
                f = tmp_path / f"{page.stem}-{i}.yaml"
                f.write_text(block)
                files.append(f)
    assert len(files) >= 3, "the ledger, policy and budget examples are gone"
    proc = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "validate", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_test_command_is_what_ci_runs():
    block = code_blocks(README.read_text(), ("bash",))[0]
    install, demo = block.splitlines()[0].split("#")[0].strip().split(" && ")
    install_test, pytest_cmd = block.splitlines()[1].split("#")[0].strip().split(" && ")
    assert demo == "offscope demo" and "demo" in _subcommands()
    assert install == "python3 -m pip install -e ."
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    ci_install = next(line for line in ci if "pip install" in line)
    assert ci_install.replace(" -q", "") == install_test, (ci_install, install_test)
    assert pytest_cmd in ci, f"{pytest_cmd!r} is not a line of .ci/run"
    assert '"pytest' in (REPO / "pyproject.toml").read_text()  # the [test] extra installs pytest

"""The user docs (README.md and docs/*.md; docs/notes/ holds lab notes and is not counted) stay short and
cite only what the repository holds: the README is at most 200 lines and the user docs at most 1750 in
all; every repository path they cite (in backticks, or as a relative link) exists; every relative link's
target and anchor exist; and none points into docs/notes/.

A cited path counts as a repository path when its first component is one of the repository's tracked
top-level entries (ROOTS, from git): `op_kernel/launcher.py`, `docs/contract.md`, `tests/`. Paths of other trees
(`graph/operator_reg.h` of CANN, `build/` of a build) are not checked, nor URLs, nor patterns with `*` or
`<` (`op_kernel/csrc/isa_*.cpp`, `op_host/<op>_tiling.py`); `{a,b}` is expanded.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
USER_DOCS_MAX_LINES = 1750


def tracked_top_level() -> set[str]:
    """The repository's top-level entries that git tracks (what a clone holds, not local builds or caches)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {path.split("/")[0] for path in listed.splitlines()}


# A repository path cited in the docs starts with one of them.
ROOTS = tracked_top_level()

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def user_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]*>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if match is None:
        return [text]
    return [expanded for choice in match.group(1).split(",")
            for expanded in expand_braces(text[:match.start()] + choice + text[match.end():])]


def cited_paths(text: str) -> list[str]:
    """Repository paths cited in backticks (outside fenced code blocks)."""
    found = []
    for code in INLINE_CODE.findall(FENCE.sub("", text)):
        if any(mark in code for mark in "*<> $") or "://" in code or "/" not in code:
            continue
        for path in expand_braces(code):
            if path.split("/")[0] in ROOTS:
                found.append(path)
    return found


def problems(text: str, doc: Path) -> list[str]:
    """What in `text` (the content of `doc`) cites something the repository lacks."""
    found = []
    for path in cited_paths(text):
        if not (REPO / path).exists():
            found.append(f"{path}: no such path in the repository")
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL (https:, mailto:)
            continue
        file_part, _, anchor = target.partition("#")
        file = doc if not file_part else (doc.parent / file_part).resolve()
        if not file.exists():
            found.append(f"{target}: no such file")
            continue
        if "notes" in file.relative_to(REPO).parts[:2] and file.relative_to(REPO).parts[0] == "docs":
            found.append(f"{target}: the user docs do not link to the lab notes")
        if anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            found.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(REPO)}")
    for path in cited_paths(text):
        if path.startswith("docs/notes"):
            found.append(f"{path}: the user docs do not cite the lab notes")
    return found


def test_readme_is_short():
    assert line_count(REPO / "README.md") <= README_MAX_LINES


def test_user_docs_are_short():
    counts = {path.relative_to(REPO).as_posix(): line_count(path) for path in user_docs()}
    assert sum(counts.values()) <= USER_DOCS_MAX_LINES, counts


@pytest.mark.parametrize("doc", user_docs(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_doc_cites_only_what_exists(doc):
    found = problems(doc.read_text(encoding="utf-8"), doc)
    assert not found, "\n".join(found)


def test_the_checks_can_fail():
    doc = REPO / "docs" / "using.md"
    text = ("See `op_kernel/made_up_module.py`, `tests/{test_numerics,test_made_up}.py`, "
            "[the contract](contract.md#no-such-heading), [gone](missing.md), [notes](notes/x.md) and\n"
            "`op_kernel/launcher.py`, `op_kernel/csrc/isa_*.cpp`, `graph/operator_reg.h`, "
            "[the contract](contract.md#the-two-phase-pair-blockattnresprepare-and-blockattnresupdate).\n")
    found = problems(text, doc)
    assert any("op_kernel/made_up_module.py" in problem for problem in found)
    assert any("tests/test_made_up.py" in problem for problem in found)
    assert not any("tests/test_numerics.py" in problem for problem in found)
    assert any("#no-such-heading" in problem for problem in found)
    assert any("missing.md" in problem for problem in found)
    assert any("notes/x.md" in problem for problem in found)
    assert len(found) == 5, found
    assert slug("The two-phase pair: `BlockAttnResPrepare` and `BlockAttnResUpdate`") == (
        "the-two-phase-pair-blockattnresprepare-and-blockattnresupdate")
    assert slug("Your inputs' pages") == "your-inputs-pages"

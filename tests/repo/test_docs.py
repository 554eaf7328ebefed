"""The Markdown files of the repository: every code fence closes (an unclosed one renders the rest inverted)."""

from __future__ import annotations

import re
import subprocess

import pytest

from helpers.paths import REPO

# CommonMark: a fence is three or more backticks or tildes; a backtick fence's info string has no backtick
_OPENING = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def unclosed_fences(text: str) -> list[int]:
    """The 1-based line numbers of fences that open and never close.

    A closing fence uses the opening's character, is at least as long and has nothing but spaces after it.
    A fence with an info string where a close could stand (```python inside an open block) is CommonMark
    text, but always a forgotten close in our docs, so the block it sits in counts as unclosed too.
    Indentation is not checked, so fences inside list items count as well.
    """
    open_fence: tuple[str, int] | None = None
    unclosed = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _OPENING.match(line)
        if match is None:
            continue
        fence, info = match["fence"], match["info"]
        if open_fence is None:
            if fence[0] == "`" and "`" in info:
                continue  # inline code such as ```x```, not a fence
            open_fence = (fence, number)
        elif fence[0] == open_fence[0][0] and len(fence) >= len(open_fence[0]):
            if info.strip():
                unclosed.append(open_fence[1])
                open_fence = (fence, number)
            else:
                open_fence = None
    if open_fence is not None:
        unclosed.append(open_fence[1])
    return unclosed


def _tracked_markdown() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return listed.stdout.split()


def test_every_tracked_markdown_file_closes_its_fences() -> None:
    files = _tracked_markdown()
    assert "README.md" in files
    broken = {name: unclosed_fences((REPO / name).read_text()) for name in files}
    assert not {name: lines for name, lines in broken.items() if lines}


@pytest.mark.parametrize(("text", "unclosed"), [
    ("```python\nx = 1\n```\n", []),
    ("```python\nx = 1\nprose\n\n```sh\nls\n```\n", [1]),  # a second opener where the close was forgotten
    ("```\nx = 1\n", [1]),
    ("````\n```\n````\n", []),  # a shorter fence inside a longer one is text
    ("~~~\n```\n~~~\n", []),  # the other character does not close
    ("```\ncode\n``` not a close\n```\n", [1]),  # a closing fence takes no info string
    ("- item\n\n  ```sh\n  ls\n  ```\n", []),  # indented inside a list item
    ("use ```x``` inline\n", []),
])
def test_the_fence_rule_follows_commonmark(text: str, unclosed: list[int]) -> None:
    assert unclosed_fences(text) == unclosed

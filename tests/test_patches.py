"""Each patch under patches/ carries a header as `git format-patch` writes one, saying why it exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

PATCHES = sorted((Path(__file__).resolve().parent.parent / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))


def test_there_are_patches() -> None:
    assert PATCHES


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_has_a_format_patch_header(patch: Path) -> None:
    text = patch.read_text()
    head, sep, diff = text.partition("\n---\n")
    assert sep, "no '---' line between the header and the diff"
    lines = head.split("\n")
    assert re.fullmatch(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001", lines[0])
    assert lines[1].startswith("From: ") and "@" in lines[1]
    assert lines[2].startswith("Date: ")
    assert re.fullmatch(r"Subject: \[PATCH\] \S.*", lines[3])
    assert lines[4] == "", "a blank line after the subject"
    body = " ".join(lines[5:]).strip()
    assert len(body.split()) >= 20, "a paragraph on why the change is needed and why it is a patch"
    assert "--- a/" in diff and "+++ b/" in diff

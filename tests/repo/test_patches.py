"""Each patch under patches/ carries a header as `git format-patch` writes one, saying why it exists."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO, SCRIPTS

PATCHES = sorted((REPO / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))


def test_there_are_patches() -> None:
    assert PATCHES


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_has_a_format_patch_header(patch: Path) -> None:
    text = patch.read_text()
    head, sep, diff = text.partition("\n---\n")
    assert sep, "no '---' line between the header and the diff"
    head = re.sub(r"\n (?=\S)", " ", head, count=1) if "\nSubject: " in head else head  # a folded subject
    lines = head.split("\n")
    # git format-patch --zero-commit (scripts/refresh-patches): no commit id of a checkout of ours
    assert lines[0] == "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
    assert lines[1].startswith("From: ") and "@" in lines[1]
    assert lines[2].startswith("Date: ")
    assert re.fullmatch(r"Subject: \[PATCH\] \S.*", lines[3])
    assert lines[4] == "", "a blank line after the subject"
    body = " ".join(lines[5:]).strip()
    assert len(body.split()) >= 20, "a paragraph on why the change is needed and why it is a patch"
    assert "--- a/" in diff and "+++ b/" in diff


def test_refreshing_the_patches_changes_nothing() -> None:
    """scripts/refresh-patches applies the series to a git checkout of the pinned tree and writes it back
    with git format-patch: the committed patches must be exactly what it writes."""
    script = SCRIPTS / "refresh-patches"
    res = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert "would change 0 of" in res.stdout

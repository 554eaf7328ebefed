"""scripts/so-scenario (long prompt, continuation, two prompts in one batch; -so 0 against -so 1) on CPU
virtual devices with the tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import SCRIPTS

SCRIPT = SCRIPTS / "so-scenario"


def test_split_overlap_gives_the_same_greedy_tokens(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "scenario.json"
    env = dict(os.environ, GGML_CPU_VIRTUAL_DEVICES="2")
    res = subprocess.run([sys.executable, str(SCRIPT), "-m", str(tiny_model), "--prompt", "300",
                          "--continuation", "100", "--pair", "150", "--gen", "4", "-b", "128", "-ub", "64",
                          "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "greedy tokens: identical" in res.stdout
    so0, so1 = json.loads(out.read_text())
    assert so0["tokens"] == so1["tokens"] and len(so0["tokens"]["pair"]) == 2
    assert not so0["split_overlap"]["enabled"] and so1["split_overlap"]["enabled"]
    assert min(so1["split_overlap"]["ubatches"]) > 0  # both lanes ran
    assert set(so0["prefill_tps"]) == {"prompt", "continuation", "pair"}

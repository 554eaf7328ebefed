"""scripts/gpu-check: the flags, the machine, then the selected stages in their order, the summary last."""
from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Mapping, Sequence

from .context import Context
from .options import parse_args
from .registry import ORDER, default_names, registered
from .runner import NO_MULTICAST, Abort, Cmd, Runner, env_text


def list_stages() -> None:
    print("Stages, in the order they run (* the default ones):\n")
    for s in registered():
        print(f"{'*' if s.default else ' '} {s.name}")
        print(textwrap.fill(s.summary, 110, initial_indent="    ", subsequent_indent="    "), end="\n\n")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    opts = parse_args(argv, ORDER, default_names(), os.environ if environ is None else environ)
    if opts.list_stages:
        list_stages()
        return 0
    run = Runner(opts.dry_run)
    cx = Context(opts, run, opts.stages)
    if run.dry_run:
        run.show(f"export {env_text(NO_MULTICAST)} PYTHONUNBUFFERED=1")
    deadline = time.monotonic() + opts.budget_s  # stages that would start later are skipped, so logs come back
    run.fresh_dir(cx.logs)  # WORK outlives a call on a warm machine: no logs of an earlier run
    run.mkdirs(cx.out, cx.work / "models")
    try:
        cx.prepare()
        for s in registered():
            if s.name not in cx.selected:
                continue
            if time.monotonic() >= deadline:
                run.log(f"skipping {s.name}: out of time")
                continue
            s.run(cx)
        run.log("summary")
        run.check("summary", run.run(Cmd([cx.py, cx.script("gpu-summary"), str(cx.out)])))
    except Abort:
        return 1
    finally:
        run.tar(cx.out / "logs.tgz", cx.logs, quiet=True)
    return 1 if run.failed else 0

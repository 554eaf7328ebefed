"""Running a check's commands with their redirections (files, the console, a tag on JSON lines), or, under
--dry-run, printing them as shell lines and running nothing."""
from __future__ import annotations

import collections
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# Never let NCCL or anything else use NVLink multicast on these shared machines: every process gets these.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class Abort(Exception):
    """A step after which the check cannot go on (the CUDA build failed)."""


def env_text(env: Mapping[str, str]) -> str:
    """An environment as VAR=value words."""
    return " ".join(f"{k}={v}" for k, v in env.items())


@dataclass(frozen=True)
class Sink:
    """Where a stream goes: the console and/or files, written afresh or appended to."""
    files: tuple[Path, ...] = ()
    append: bool = False
    console: bool = True


CONSOLE = Sink()
NULL = Sink(console=False)


def to(path: Path, append: bool = False) -> Sink:
    """Into a file only (> or >>)."""
    return Sink((path,), append, console=False)


def tee(*paths: Path, append: bool = False) -> Sink:
    """To the console and into files (| tee, | tee -a)."""
    return Sink(paths, append, console=True)


@dataclass
class Cmd:
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the run's environment
    cwd: Path | None = None
    out: Sink = CONSOLE
    err: Sink | None = CONSOLE  # None: into stdout (2>&1)
    tag: str = ""  # JSON fields put first into every line that starts with '{' (sed 's/^{/{"tool": ..., /')
    tail: int = 0  # > 0: the console gets only the last lines of stdout (| tail -N)

    def shell(self) -> str:
        """The command as a shell line (what --dry-run prints)."""
        line = " ".join([f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.quote(a) for a in self.argv])
        piped = bool(self.tag or self.tail or (self.out.files and self.out.console))
        if not piped and self.out.files:
            line += f" {'>>' if self.out.append else '>'} {self.out.files[0]}"
        elif not piped and not self.out.console:
            line += " > /dev/null"
        if self.err is None:
            line += " 2>&1"
        elif self.err.files:
            line += f" {'2>>' if self.err.append else '2>'} {self.err.files[0]}"
        elif not self.err.console:
            line += " 2> /dev/null"
        if self.tag:
            line += f" | sed 's/^{{/{{{self.tag}/'"
        if piped and self.out.files:
            line += (f" | tee {'-a ' if self.out.append else ''}{' '.join(map(str, self.out.files))}"
                     if self.out.console else f" {'>>' if self.out.append else '>'} {self.out.files[0]}")
        if self.tail:
            line += f" | tail -{self.tail}"
        return f"(cd {self.cwd} && {line})" if self.cwd else line


def _open(sink: Sink, stack: ExitStack) -> list[IO[bytes]]:
    return [stack.enter_context(open(p, "ab" if sink.append else "wb")) for p in sink.files]


def _direct(sink: Sink | None, stack: ExitStack) -> Any:
    """The Popen argument for a stream that needs no copying here (the console, one file, nothing)."""
    if sink is None:
        return subprocess.STDOUT
    if sink.files:
        return _open(sink, stack)[0]
    return None if sink.console else subprocess.DEVNULL


class Background:
    """A process started with Runner.start: wait for it, or stop it."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, status: int = 0) -> None:
        self.proc = proc
        self.status = status  # without a process: what wait() says

    def wait(self) -> int:
        return self.status if self.proc is None else _status(self.proc.wait())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by a signal: as the shell says it


class Runner:
    """Runs commands (or prints them under dry_run), logs, and counts failed steps."""

    def __init__(self, dry_run: bool, env: Mapping[str, str] | None = None) -> None:
        self.dry_run = dry_run
        self.env = {**(os.environ if env is None else env), **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
        self.failed = False

    def log(self, msg: str) -> None:
        print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def fail(self, msg: str) -> None:
        self.log(msg)
        self.failed = True

    def check(self, what: str, rc: int) -> None:
        """A step's exit status counts in the run's."""
        if rc != 0:
            self.fail(f"{what} failed: rc={rc}")

    def show(self, line: str) -> None:
        print(f"+ {line}", flush=True)

    def run(self, cmd: Cmd) -> int:
        """Run a command to its end; its exit status (that of the command, not of a tee or tag after it)."""
        if self.dry_run:
            self.show(cmd.shell())
            return 0
        sys.stdout.flush()
        with ExitStack() as stack:
            copy = bool(cmd.tag or cmd.tail or (cmd.out.files and cmd.out.console) or len(cmd.out.files) > 1)
            stdout = subprocess.PIPE if copy else _direct(cmd.out, stack)
            assert cmd.err is None or len(cmd.err.files) <= 1, "stderr goes to one place"
            try:
                proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env={**self.env, **cmd.env}, stdout=stdout,
                                        stderr=_direct(cmd.err, stack))
            except OSError as e:  # as a shell says it (into the command's stderr): not found 127, not executable 126
                err = cmd.out if cmd.err is None else cmd.err
                message = f"gpu-check: {cmd.argv[0]}: {e.strerror}\n"
                for f in _open(err, stack):
                    f.write(message.encode())
                if err.console:
                    print(message, end="", file=sys.stderr, flush=True)
                return 127 if isinstance(e, FileNotFoundError) else 126
            if copy:
                self._copy(proc, cmd, _open(cmd.out, stack))
            return _status(proc.wait())

    @staticmethod
    def _copy(proc: subprocess.Popen[bytes], cmd: Cmd, files: list[IO[bytes]]) -> None:
        assert proc.stdout is not None
        last: collections.deque[bytes] = collections.deque(maxlen=cmd.tail or None)
        tag = cmd.tag.encode()
        for line in proc.stdout:
            if tag and line.startswith(b"{"):
                line = b"{" + tag + line[1:]
            for f in files:
                f.write(line)
            if cmd.out.console and cmd.tail:
                last.append(line)
            elif cmd.out.console:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
        sys.stdout.buffer.write(b"".join(last))
        sys.stdout.buffer.flush()

    def start(self, cmd: Cmd) -> Background:
        """Start a command whose output goes to the console or one file each, and return at once (&)."""
        if self.dry_run:
            self.show(cmd.shell() + " &")
            return Background(None)
        assert not (cmd.tag or cmd.tail or len(cmd.out.files) > 1 or (cmd.out.files and cmd.out.console))
        sys.stdout.flush()
        with ExitStack() as stack:  # the child holds its own copies of the files
            try:
                return Background(subprocess.Popen(cmd.argv, cwd=cmd.cwd, env={**self.env, **cmd.env},
                                                   stdout=_direct(cmd.out, stack), stderr=_direct(cmd.err, stack)))
            except OSError as e:
                print(f"gpu-check: {cmd.argv[0]}: {e.strerror}", file=sys.stderr, flush=True)
                return Background(None, 127 if isinstance(e, FileNotFoundError) else 126)

    def query(self, argv: Sequence[str]) -> str | None:
        """A read-only question to the machine, asked under --dry-run too: the command's stdout, None when it
        failed or does not exist."""
        try:
            res = subprocess.run(argv, check=False, env=self.env, capture_output=True, text=True)
        except OSError:
            return None
        return res.stdout if res.returncode == 0 else None

    # Files: changed only outside --dry-run, which prints what it would do.

    def fresh_dir(self, path: Path) -> None:
        if self.dry_run:
            return self.show(f"rm -rf {path} && mkdir -p {path}")
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)

    def truncate(self, path: Path) -> None:
        """An empty file (: > path), which the steps after append to."""
        if self.dry_run:
            return self.show(f": > {path}")
        path.write_bytes(b"")

    def mkdirs(self, *paths: Path) -> None:
        if self.dry_run:
            return self.show(f"mkdir -p {' '.join(map(str, paths))}")
        for p in paths:
            p.mkdir(parents=True, exist_ok=True)

    def write(self, path: Path, text: str, append: bool = False) -> None:
        if self.dry_run:
            return self.show(f"echo {shlex.quote(text.rstrip())} {'>>' if append else '>'} {path}")
        with open(path, "a" if append else "w") as f:
            f.write(text)

    def note(self, text: str, *files: Path, append: bool = False) -> None:
        """A line to the console and into files (echo ... | tee)."""
        print(text, flush=True)
        if not self.dry_run:
            for path in files:
                self.write(path, text + "\n", append)

    def remove(self, *paths: Path) -> None:
        if self.dry_run and paths:
            return self.show(f"rm -f {' '.join(map(str, paths))}")
        for p in paths:
            p.unlink(missing_ok=True)

    def link(self, target: Path | str, name: Path) -> None:
        if self.dry_run:
            return self.show(f"ln -sfn {target} {name}")
        name.unlink(missing_ok=True)
        name.symlink_to(target)

    def show_tail(self, path: Path, n: int) -> None:
        """The last lines of a log on the console (tail -N)."""
        if self.dry_run:
            return self.show(f"tail -{n} {path}")
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        for line in lines[-n:]:
            print(line, flush=True)

    def tar(self, archive: Path, folder: Path, quiet: bool = False) -> int:
        """The folder's files into a .tgz (quiet: without tar's complaints)."""
        return self.run(Cmd(["tar", "czf", str(archive), "-C", str(folder), "."], err=NULL if quiet else CONSOLE))

"""What the stages of a check share: the flags, the runner, the folders, what the machine has (GPUs, the NCCL
wheel), the builds' Python paths and the synthetic models."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .options import REPO
from .runner import CONSOLE, NULL, Background, Cmd, Runner, Sink, tee, to

GPU_QUERY = ("nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader")
NCCL_QUERY = ("import importlib.util as u; "
              "print(list(u.find_spec('nvidia.nccl').submodule_search_locations)[0])")
SERVER_EXTRA = "import fastapi, uvicorn, sse_starlette, httpx"
# no peer access, emulated (NCCL through host memory), and our copy engines forced for every reduction size
NO_PEER_ACCESS = {"NCCL_P2P_DISABLE": "1", "GGML_CUDA_AR_CE": "1"}


def gpu_list(run: Runner) -> list[str]:
    """One line per GPU (index, name, memory, driver), as nvidia-smi lists them; none without nvidia-smi."""
    out = run.query(GPU_QUERY)
    return (out or "").splitlines()


def nccl_wheel(run: Runner, python: str) -> Path | None:
    """The folder of the nvidia-nccl wheel (include/, lib/libnccl.so.2) that `python` imports, if any."""
    out = run.query([python, "-c", NCCL_QUERY])
    return Path(out.strip()) if out and out.strip() else None


def carried_wheels(repo: Path) -> list[Path]:
    """The wheels carried in REPO/.whl (git-ignored), for packages the GPU machine lacks."""
    return sorted((repo / ".whl").glob("*.whl"))


class Context:
    """One check's shared state, and the commands and files its stages have in common."""

    def __init__(self, opts: argparse.Namespace, run: Runner, selected: Sequence[str]) -> None:
        self.opts = opts
        self.run = run
        self.selected = frozenset(selected)
        self.repo = REPO
        self.out: Path = opts.out
        self.work: Path = opts.work
        self.logs = self.work / "logs"  # every log; bundled into OUT/logs.tgz at the end (few files come back)
        self.py: str = opts.python
        self.cuda_path = str(self.work / "cuda")  # PYTHONPATH of the CUDA build, and of the wheels' packages
        self.nccl_arg = "-DGGML_CUDA_NCCL=OFF"
        self.n_gpus = 0
        self._made: set[Path] = set()  # files that commands of this run write (what --dry-run counts as there)
        self._memo: dict[str, Any] = {}

    # The machine, looked at before the first stage.

    def prepare(self) -> None:
        """Wheels the machine lacks, the GPUs it has, the NCCL folder the CUDA build links."""
        wheels = carried_wheels(self.repo)
        if wheels:
            self._install_wheels(wheels)
        gpus = gpu_list(self.run)
        listing = "".join(f"{line}\n" for line in gpus)
        if self.run.dry_run:
            self.run.show(f"{' '.join(GPU_QUERY)} | tee {self.logs / 'gpus.txt'}")
        else:
            (self.logs / "gpus.txt").write_text(listing)
        print(listing, end="", flush=True)
        self.n_gpus = len(gpus)
        self.run.run(Cmd(["nvidia-smi", "topo", "-m"], out=to(self.logs / "topo.txt"), err=None))
        self._link_nccl(nccl_wheel(self.run, self.py))

    def _install_wheels(self, wheels: list[Path]) -> None:
        """Python packages a machine without network access lacks (the server and test extras), as wheels in
        REPO/.whl (git-ignored; e.g. pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
        fastapi ...): installed into WORK/site, which follows the CUDA build on PYTHONPATH."""
        rc = self.run.run(Cmd([self.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(self.work / "site"), *map(str, wheels)],
                              out=to(self.logs / "wheels.log"), err=None))
        if rc == 0:
            self.cuda_path = f"{self.work / 'cuda'}:{self.work / 'site'}"
        else:
            self.run.fail(f"installing the wheels of {self.repo / '.whl'} failed (see wheels.log)")

    def _link_nccl(self, wheel: Path | None) -> None:
        """NCCL from the nvidia-nccl wheel: a folder with include/ and lib/libnccl.so for FindNCCL."""
        if wheel is None:
            self.run.log("no nvidia-nccl wheel: building without NCCL")
            return
        nccl = self.work / "nccl"
        self.run.mkdirs(nccl / "lib")
        self.run.link(wheel / "include", nccl / "include")
        self.run.link(wheel / "lib" / "libnccl.so.2", nccl / "lib" / "libnccl.so.2")
        self.run.link("libnccl.so.2", nccl / "lib" / "libnccl.so")
        self.run.env["LD_LIBRARY_PATH"] = f"{nccl / 'lib'}:{self.run.env.get('LD_LIBRARY_PATH', '')}"
        if self.run.dry_run:
            self.run.show(f"export LD_LIBRARY_PATH={self.run.env['LD_LIBRARY_PATH']}")
        self.nccl_arg = f"-DNCCL_ROOT={nccl}"

    # Commands.

    def script(self, name: str) -> str:
        return str(self.repo / "scripts" / name)

    def py_cuda(self, *args: str, env: Mapping[str, str] | None = None, **kw: Any) -> Cmd:
        """Python on the CUDA build, in WORK."""
        return Cmd([self.py, *args], env={**(env or {}), "PYTHONPATH": self.cuda_path}, cwd=self.work, **kw)

    def py_cpu(self, *args: str, env: Mapping[str, str] | None = None, **kw: Any) -> Cmd:
        """Python on the CPU build, in WORK."""
        return Cmd([self.py, *args], env={**(env or {}), "PYTHONPATH": str(self.work / "cpu")}, cwd=self.work,
                   **kw)

    def two_devices(self) -> dict[str, str]:
        """The environment of a two-GPU run: nothing on two GPUs; two CUDA devices of GPU 0 (the proxy) on one."""
        return {} if self.n_gpus >= 2 else {"CUDA_VISIBLE_DEVICES": "0", "GGML_CUDA_DEVICES": "2"}

    def warmup(self) -> list[str]:
        """Extra flags of every pyllama_so.bench run."""
        n = self.opts.warmup_runs
        return [] if n is None else ["--warmup-runs", str(n)]

    def bench(self, model: Path, *flags: str) -> list[str]:
        """pyllama_so.bench's arguments: the model, the flags, JSON lines out."""
        return ["-m", "pyllama_so.bench", "-m", str(model), *flags, "-o", "jsonl", "--no-progress"]

    # Files.

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """make()'s result, made at the first call of the run."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def upstream_server(self) -> Path | None:
        """Upstream's llama-server of the CUDA build (stage upserver builds it)."""
        return self.built("llama-server", under="upstream-tools/server", stage="upserver")

    def exists(self, path: Path) -> bool:
        return path.exists() or (self.run.dry_run and path in self._made)

    def made(self, path: Path) -> Path:
        self._made.add(path)
        return path

    def synth(self, shape: str, kind: str, out: Sink = CONSOLE) -> Path:
        """A synthetic model under WORK/models, written by its first user."""
        path = self.work / "models" / f"{shape}-{kind}.gguf"
        if not self.exists(path):
            self.run.run(self.py_cuda("-m", "pyllama_so.synth", shape, "-t", kind, "-o", str(path), out=out))
        return self.made(path)

    def model(self) -> Path:
        """The F16 model of stages tpbench, bench and logits (--model)."""
        return self.synth(self.opts.model, "f16")

    def so_model(self) -> Path:
        """The Q8_0 model of the split-overlap, server, generation and trace stages (--so-model)."""
        return self.synth(self.opts.so_model, "q8_0", out=NULL)

    def server_extra(self, what: str) -> bool:
        """Whether the CUDA build's Python has the server extra; a stage that needs it and finds none fails."""
        if self.run.run(self.py_cuda("-c", SERVER_EXTRA, out=CONSOLE, err=to(self.logs / "wheels.log", True))) == 0:
            return True
        self.run.fail(f"{what} skipped: the server extra is neither installed nor carried in {self.repo / '.whl'}")
        return False

    def built(self, name: str, under: str = "", stage: str = "build") -> Path | None:
        """An executable `name` (in a folder ending in `under`) of the CUDA build tree, the first by path; under
        --dry-run, the one the build would make when `stage` is selected."""
        root = self.repo / "build" / "cuda"
        found = sorted(p for p in root.rglob(name) if p.is_file() and os.access(p, os.X_OK)
                       and str(p.parent).endswith(under)) if root.exists() else []
        if found:
            return found[0]
        if self.run.dry_run and "build" in self.selected and stage in self.selected:
            return root / "..." / under / name
        return None

    def vram_start(self, csv: Path) -> Background:
        """Sample every GPU's memory in use until vram_peak."""
        return self.run.start(Cmd(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                   "-lms", "200"], out=to(csv), err=None))

    def vram_peak(self, sampler: Background, csv: Path, label: str, *files: Path) -> None:
        """Stop the sampling and print (and append to files) the peak per GPU."""
        sampler.stop()
        self.run.run(Cmd([self.py, self.script("vram_peak.py"), str(csv), label], out=tee(*files, append=True)))

"""The traced stages: profile, steptrace, servertrace. Each traces its processes with tools/cupti-trace
(CUPTI of the nvidia-cuda-cupti wheel or the toolkit) and draws and measures the traces with
scripts/so-timeline; a stage is skipped without CUPTI."""
from __future__ import annotations

import re
from pathlib import Path

from .context import NO_PEER_ACCESS, Context
from .options import env_words
from .registry import stage
from .runner import Cmd, Sink, tee, to


def newest_record(header: str, kind: str) -> str:
    """The newest record struct of a kind that a CUPTI header declares (CUpti_ActivityKernel9 over
    CUpti_ActivityKernel8 and CUpti_ActivityKernel)."""
    found = re.findall(rf"\}} (CUpti_Activity{kind}([0-9]*));", header)
    return max(found, key=lambda f: int(f[1] or -1))[0] if found else ""


def _find_cupti(cx: Context) -> tuple[Path, Path] | None:
    """cupti_activity.h and libcupti.so* of the toolkit or of the nvidia wheels."""
    roots = [Path("/usr/local/cuda/extras/CUPTI")]
    wheels = cx.run.query([cx.py, "-c", "import nvidia; print(list(nvidia.__path__)[0])"])
    if wheels and wheels.strip():
        roots.append(Path(wheels.strip()))
    headers = [h for r in roots if r.is_dir() for h in sorted(r.rglob("cupti_activity.h"))]
    if not headers:
        return None
    libs = sorted(headers[0].parent.parent.rglob("libcupti.so*"), key=str)
    return (headers[0], libs[0]) if libs else None


def tracer(cx: Context) -> Path | None:
    """tools/cupti-trace built once per run against the CUPTI found here, its record structs the header's
    newest; None without CUPTI or a library."""
    def build() -> Path | None:
        found = _find_cupti(cx)
        if found is None:
            cx.run.log("no CUPTI headers found: stages profile, steptrace and servertrace will be skipped")
            return None
        header, lib = found
        text = header.read_text(errors="replace")
        records = [f"-DCT_{kind.upper()}_T={newest_record(text, kind)}" for kind in ("Kernel", "Memcpy", "Memset")]
        so = cx.work / "libcupti-trace.so"
        rc = cx.run.run(Cmd(["gcc", "-O2", "-shared", "-fPIC", "-I", str(header.parent.parent / "include"), "-I",
                             "/usr/local/cuda/include", *records, "-o", str(so),
                             str(cx.repo / "tools" / "cupti-trace" / "cupti-trace.c"), str(lib),
                             f"-Wl,-rpath,{lib.parent}"], out=to(cx.logs / "cupti-trace-build.log"), err=None))
        cx.run.check(f"cupti-trace build ({lib})", rc)
        if rc == 0:
            cx.made(so)
        return so if cx.exists(so) else None
    result: Path | None = cx.once("tracer", build)
    return result


def traced(lib: Path, trace: Path) -> dict[str, str]:
    """The environment that traces a process into a CSV file."""
    return {"CUDA_INJECTION64_PATH": str(lib), "CUPTI_TRACE_OUT": str(trace)}


def timeline(cx: Context, trace: Path, png: Path, *flags: str, out: Sink) -> Cmd:
    """scripts/so-timeline: a trace drawn, and measured on the console."""
    return Cmd([cx.py, cx.script("so-timeline"), str(trace), "-o", str(png), *flags], out=out)


@stage("profile", default=False)
def profile(cx: Context) -> None:
    """A GPU timeline of pp2048 (the model of --so-model) per configuration of --profile-configs (bench flags
    after pp2048's, which they override, e.g. "-p 0 -n 64" for decode, after optional VAR=value words) under
    -sm tensor on two GPUs or else two CUDA devices of GPU 0, no peer access emulated, copy engines forced;
    the last --profile-window-ms drawn: OUT/profile.tgz (PNGs, summaries, the traces' records in the window)."""
    run, opts = cx.run, cx.opts
    lib = tracer(cx)
    if lib is None:
        return
    model = cx.so_model()
    folder = cx.work / "profile"
    run.fresh_dir(folder)
    run.log("profile: CUPTI traces under -sm tensor, NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1")
    devices = cx.two_devices()
    for cfg in opts.profile_configs:
        name = re.sub(r"[^A-Za-z0-9_.]", "", cfg)
        env, args = env_words(cfg)
        trace = folder / f"trace-{name}.csv"
        rc = run.run(cx.py_cuda(*cx.bench(model, "-sm", "tensor", "-fa", "1", "-b", "2048", "-p", "2048", "-n", "0",
                                          "-r", "2", "--warmup-runs", "2", *args),
                                env={**devices, **env, **NO_PEER_ACCESS, **traced(lib, trace)},
                                out=to(folder / f"bench-{name}.jsonl"), err=to(cx.logs / "profile.err", append=True)))
        run.check(f"profile {cfg}", rc)
        summary = folder / f"summary-{name}.txt"
        rc = run.run(timeline(cx, trace, folder / f"timeline-{name}.png", "--window-ms", opts.profile_window_ms,
                              "--title", f"-sm tensor {cfg}, copy engines, two GPUs", "--top-kernels", "8",
                              "--write-window", str(folder / f"window-{name}.csv.gz"), out=tee(summary)))
        run.check(f"so-timeline {cfg}", rc)
        run.run(timeline(cx, trace, folder / f"timeline-{name}-zoom.png", "--window-ms", "12", "--title",
                         f"-sm tensor {cfg} (last 12 ms)", out=to(summary, append=True)))
        run.remove(trace)  # too large to come back; the window's records stay
    run.tar(cx.out / "profile.tgz", folder)


@stage("steptrace", default=False)
def steptrace(cx: Context) -> None:
    """Where a server-shaped decode step's time goes, on GPU 0 (-sm none, the model of --so-model):
    scripts/generation-bench traced, one process per mode of --steptrace-modes, --steptrace-streams sequences
    one token each for --steptrace-tokens steps; scripts/so-timeline cuts the last 60 ms into steps at the
    logits' copy and names the kernels with the most time: OUT/steptrace.tgz (summaries, PNGs, the traces'
    last 60 ms, the bench's own numbers)."""
    run, opts = cx.run, cx.opts
    lib = tracer(cx)
    if lib is None:
        return
    model = cx.so_model()
    folder = cx.work / "steptrace"
    run.fresh_dir(folder)
    streams = str(opts.steptrace_streams)
    run.log(f"steptrace: CUPTI traces of generation-bench decode steps, {streams} streams: {model}")
    for mode in opts.steptrace_modes:
        trace = folder / f"trace-{mode}.csv"
        rc = run.run(cx.py_cuda(cx.script("generation-bench"), "-m", str(model), "-sm", "none", "-ngl", "-1", "-fa",
                                "on", "-p", "512", "-n", str(opts.steptrace_tokens), "-r", "1", "--streams", streams,
                                "--requests", "0", "--no-completion", "--modes", mode, "--json",
                                str(folder / f"generation-{mode}.json"),
                                env={"CUDA_VISIBLE_DEVICES": "0", **traced(lib, trace)},
                                out=to(folder / f"generation-{mode}.md"),
                                err=to(cx.logs / "steptrace.err", append=True)))
        run.check(f"steptrace {mode}", rc)
        rc = run.run(timeline(cx, trace, folder / f"timeline-{mode}.png", "--window-ms", "60", "--title",
                              f"decode steps, {streams} streams, {mode} (last 60 ms)", "--top-kernels", "10",
                              "--steps-d2h", "1048576", "--write-window", str(folder / f"window-{mode}.csv.gz"),
                              out=tee(folder / f"summary-{mode}.txt")))
        run.check(f"so-timeline steptrace {mode}", rc)
        run.remove(trace)  # too large to come back; the window's records stay
    run.tar(cx.out / "steptrace.tgz", folder)


@stage("servertrace", default=False)
def servertrace(cx: Context) -> None:
    """A server's decode steps under load, traced: scripts/server-load against our server, then llama-server
    when stage upserver built it, each in a process of its own on GPU 0: --servertrace-streams streams of 2 x
    that many requests, 512 + 128 tokens, the servers with --load-server-args; scripts/so-timeline cuts the
    window of --servertrace-window-ms ending at --servertrace-end-ms (negative: before the last kernel) into
    steps at the logits' copy: OUT/servertrace.tgz."""
    run, opts = cx.run, cx.opts
    lib = tracer(cx)
    if lib is None or not cx.server_extra("servertrace"):
        return
    model = cx.so_model()
    folder = cx.work / "servertrace"
    run.fresh_dir(folder)
    streams = opts.servertrace_streams
    upstream = cx.upstream_server()
    for name in ["ours"] + (["upstream"] if upstream else []):
        run.log(f"servertrace: {name}, {streams} streams, traced: {model}")
        trace = folder / f"trace-{name}.csv"
        rc = run.run(cx.py_cuda(cx.script("server-load"), "--server", name, "--server-bin", str(upstream or "none"),
                                "-m", str(model), "--concurrency", str(streams), "--requests", str(2 * streams),
                                "--prompt", "512", "--gen", "128", "--timeout", "300", "--json",
                                str(folder / f"server-load-{name}.json"), "--", *opts.load_server_args,
                                env={"CUDA_VISIBLE_DEVICES": "0", **traced(lib, trace)},
                                out=to(folder / f"server-load-{name}.md"),
                                err=to(cx.logs / "servertrace.err", append=True)))
        run.check(f"servertrace {name}", rc)
        rc = run.run(timeline(cx, trace, folder / f"timeline-{name}.png", "--end-ms", opts.servertrace_end_ms,
                              "--window-ms", opts.servertrace_window_ms, "--title",
                              f"{name} server, {streams} streams under load (traced)", "--top-kernels", "10",
                              "--steps-d2h", "65536", "--write-window", str(folder / f"window-{name}.csv.gz"),
                              out=tee(folder / f"summary-{name}.txt")))
        run.check(f"so-timeline servertrace {name}", rc)
        run.remove(trace)
    run.tar(cx.out / "servertrace.tgz", folder)

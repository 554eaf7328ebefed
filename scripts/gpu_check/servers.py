"""The server stages: server, upserver, serverload, mixedload. All but upserver need the server extra
(FastAPI, uvicorn, sse-starlette), installed or carried as wheels in REPO/.whl."""
from __future__ import annotations

from pathlib import Path

from .context import NO_PEER_ACCESS, Context
from .options import env_words
from .registry import stage
from .runner import Cmd, env_text, tee, to


@stage("server")
def server(cx: Context) -> None:
    """scripts/server-scenario: python -m pyllama_so.server -sm tensor --parallel 2, -so 0 then -so 1, on the
    model of --so-model, two GPUs or else two CUDA devices of GPU 0, no peer access emulated, copy engines
    forced (--server-args: its extra flags): OUT/server-scenario.json, .md."""
    run = cx.run
    if not cx.server_extra("server scenario"):
        return
    model = cx.so_model()
    env = {**cx.two_devices(), **NO_PEER_ACCESS}
    run.log(f"server scenario ({env_text(env)}): {model} {' '.join(cx.opts.server_args)}")
    rc = run.run(cx.py_cuda(cx.script("server-scenario"), "-m", str(model), *cx.opts.server_args, "--timeout", "300",
                            "--json", str(cx.out / "server-scenario.json"), env=env,
                            out=tee(cx.out / "server-scenario.md"), err=to(cx.logs / "server-scenario.err")))
    run.check("server scenario", rc)
    run.show_tail(cx.logs / "server-scenario.err", 5)


@stage("upserver", default=False)
def upserver(cx: Context) -> None:
    """Upstream's llama-server, built with the CUDA build when this stage runs (-DPYLLAMA_SO_UPSTREAM_SERVER=ON,
    from the carried .upstream tree: no web UI, nothing downloaded): checks that it lists the CUDA devices.
    Stages serverload and servertrace then measure our server against it."""
    run = cx.run
    binary = cx.upstream_server()
    if binary is None:
        run.fail(f"upserver: no llama-server under {cx.repo / 'build' / 'cuda'} (did stage build run with upserver?)")
        return
    # at the pin, llama-server --version and --list-devices print what they should, then abort in a static
    # destructor at exit ("free(): invalid pointer") while serving works: only the listing counts here
    listing = cx.logs / "llama-server-devices.txt"
    rc = run.run(Cmd([str(binary), "--list-devices"], cwd=cx.work, out=to(listing), err=None))
    if not run.dry_run and "CUDA" not in (listing.read_text(errors="replace") if listing.exists() else ""):
        run.fail("upserver: llama-server lists no CUDA device")
    run.log(f"upserver: {binary} rc={rc}")
    run.show_tail(listing, 4)


def _load(cx: Context, servers: list[str], model: Path, name: str, append_err: bool) -> Cmd:
    """scripts/server-load with the load of --load-args, the servers started with --load-server-args."""
    return cx.py_cuda(cx.script("server-load"), *servers, "-m", str(model), *cx.opts.load_args, "--timeout", "300",
                      "--json", str(cx.out / f"{name}.json"), "--", *cx.opts.load_server_args,
                      out=tee(cx.out / f"{name}.md"), err=to(cx.logs / "server-load.err", append=append_err))


@stage("serverload", default=False)
def serverload(cx: Context) -> None:
    """scripts/server-load: our server, then llama-server (when stage upserver built it), with the same model
    (--so-model) and flags: the load of --load-args, both servers with --load-server-args:
    OUT/server-load.json, .md. Then ours alone with each flag set of --load-ours-variants: OUT/server-load-vN.json."""
    run = cx.run
    if not cx.server_extra("server load"):
        return
    model = cx.so_model()
    upstream = cx.upstream_server()
    servers = ["--server", "ours"]
    if upstream is not None:
        servers = ["--server", "ours,upstream", "--server-bin", str(upstream)]
    else:
        run.log("server load: no llama-server built (stage upserver), ours only")
    run.log(f"server load ({' '.join(servers)}): {model}")
    run.check("server load", run.run(_load(cx, servers, model, "server-load", append_err=False)))
    run.show_tail(cx.logs / "server-load.err", 5)
    for v, flags in enumerate(cx.opts.load_ours_variants, 1):
        run.log(f"server load, ours with {flags}")
        rc = run.run(_load(cx, ["--server", "ours", f"--ours-args={flags}"], model, f"server-load-v{v}",
                           append_err=True))
        run.check(f"server load ({flags})", rc)


@stage("mixedload", default=False)
def mixedload(cx: Context) -> None:
    """scripts/server-load's mixed scenario (generating streams and long prompts) on our server, -sm tensor on
    two GPUs or else two CUDA devices of GPU 0, no peer access emulated, copy engines forced: one server per
    configuration of --mixed-configs (server flags after optional VAR=value words), the scenario of
    --mixed-args, every server also with --mixed-server-args: OUT/mixed-N.json, .md (N: the configuration's
    place in the list, from 1)."""
    run, opts = cx.run, cx.opts
    if not cx.server_extra("mixed load"):
        return
    model = cx.so_model()
    devices = cx.two_devices()
    for i, cfg in enumerate(opts.mixed_configs, 1):
        env, args = env_words(cfg)
        run.log(f"mixed load {i}: {cfg} ({env_text(devices) or 'two GPUs'} NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1): "
                f"{model}")
        rc = run.run(cx.py_cuda(cx.script("server-load"), "--server", "ours", "-m", str(model), "--scenario", "mixed",
                                *opts.mixed_args, "--timeout", "300", "--json", str(cx.out / f"mixed-{i}.json"), "--",
                                "-sm", "tensor", *args, *opts.mixed_server_args,
                                env={**devices, **NO_PEER_ACCESS, **env}, out=tee(cx.out / f"mixed-{i}.md"),
                                err=to(cx.logs / f"mixed-{i}.err")))
        run.check(f"mixed load {i} ({cfg})", rc)
        run.show_tail(cx.logs / f"mixed-{i}.err", 3)

"""`python -m pyllama_so.server`: an OpenAI-compatible server with parallel slots.

    python -m pyllama_so.server -m model.gguf -sm tensor -so 1 -c 32768 --parallel 2 --port 8080

The model and batch flags are the bench's, one value each, with the same LLAMA_ARG_* variables.
Without -m it serves the cached synthetic model (--synthetic). It listens on 127.0.0.1 unless --host
says otherwise. docs/server.md has the endpoints, the slots and the errors.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from pyllama_so import _llama, args as A
from pyllama_so.config import ContextParams, ModelParams, create_context, load_model
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.cors import cors_options
from pyllama_so.server.sampling_flags import add_sampler_flags, sampling_defaults
from pyllama_so.server.settings import ServerDefaults
from pyllama_so.server.upstream_flags import add_upstream_flags, warn_ignored
from pyllama_so.synth import SHAPES, cached_model

EXTRA = 'pip install "pyllama_so[server]"'
log = logging.getLogger("pyllama_so.server")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    A.add_model_args(ap, synthetic_shapes=list(SHAPES))
    ap.add_argument("-c", "--ctx-size", type=A.non_negative_int, default=A.env_default("CTX_SIZE", "4096"),
                    metavar="N", help="KV cache tokens of all slots together, each slot getting N / --parallel "
                    "rounded up to 256; 0: the model's training context (env LLAMA_ARG_CTX_SIZE; default 4096)")
    ap.add_argument("-np", "--parallel", type=A.positive_int, default=A.env_default("N_PARALLEL", "4"),
                    metavar="N", help="slots: requests generated together (env LLAMA_ARG_N_PARALLEL; default 4)")
    ap.add_argument("--queue-size", type=A.non_negative_int, default="64", metavar="N",
                    help="requests that may wait for a slot; more get 503 (default 64)")
    ap.add_argument("--prefill-chunk", type=A.positive_int, default=None, metavar="N",
                    help="the most prompt tokens a step takes while slots generate: larger gives prompts more "
                    "throughput, smaller keeps the generating streams' inter-token latency down (default: -ub, with "
                    "split overlap on 2 x -ub, one ubatch a lane; at most -b, llama-server's schedule)")
    ap.add_argument("--step-log", type=Path, default=None, metavar="FILE",
                    help="write one JSON line per decode step to FILE: its generating slots, prompt tokens, "
                    "and milliseconds in each phase (what a load's time went to)")
    ap.add_argument("--host", default=A.env_default("HOST", "127.0.0.1"),
                    help="address to listen on (env LLAMA_ARG_HOST; default 127.0.0.1, loopback only)")
    ap.add_argument("--port", type=A.tcp_port(0), default=A.env_default("PORT", "8080"),
                    help="0: any free port, logged at start (env LLAMA_ARG_PORT; default 8080)")
    ap.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY") or None, metavar="KEY",
                    help="require the key, as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY', everywhere but "
                    "/health (env LLAMA_API_KEY)")
    ap.add_argument("-a", "--alias", default=A.env_default("ALIAS", "") or None, metavar="NAME",
                    help="the model's id in responses and /v1/models (default: the file name; env LLAMA_ARG_ALIAS)")
    ap.add_argument("--chat-template", default=A.env_default("CHAT_TEMPLATE", "") or None, metavar="NAME|TEXT",
                    help="a llama.cpp built-in template, chat_template.NAME (the model's "
                    "tokenizer.chat_template.NAME) or a Jinja template text; default: the model's own (Jinja), "
                    "else chatml (env LLAMA_ARG_CHAT_TEMPLATE). Built-ins: "
                    + ", ".join(_llama.chat_builtin_templates()))
    ap.add_argument("--chat-template-file", default=A.env_default("CHAT_TEMPLATE_FILE", "") or None, metavar="FILE",
                    help="a Jinja chat template file, instead of --chat-template (env LLAMA_ARG_CHAT_TEMPLATE_FILE)")
    ap.add_argument("--shutdown-grace", type=A.non_negative_float, default="5", metavar="SECONDS",
                    help="on SIGINT or SIGTERM, the time requests in progress get to finish before they end "
                    "with finish_reason length; a second signal ends them at once (default 5)")
    ap.add_argument("--backend-sampling", action="store_true",
                    help="run each slot's sampler chain in the decode graph (llama.cpp's experimental backend "
                         "sampling; kept on the CPU under -sm tensor and for grammars and logprobs)")
    ap.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                    default=A.env_default("EMBEDDINGS", "0").lower() in ("1", "true", "on", "enabled"),
                    help="serve /v1/embeddings, /embedding and /embeddings from an embedding context of -ub "
                    "tokens beside the slots (env LLAMA_ARG_EMBEDDINGS)")
    ap.add_argument("--pooling", choices=["none", "mean", "cls", "last", "rank"],
                    default=A.env_default("POOLING", "") or None,
                    help="pooling of the embeddings; default: the model's (env LLAMA_ARG_POOLING)")
    ap.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                    help="normalisation of pooled embeddings: -1 none, 0 max absolute (int16), 1 taxicab, "
                    "2 Euclidean, >2 p-norm (default 2)")
    ap.add_argument("--temp", "--temperature", dest="temperature", type=float,
                    default=os.environ.get("LLAMA_ARG_TEMPERATURE"), metavar="N",
                    help="the temperature of a request that gives none (default: 0.8; env LLAMA_ARG_TEMPERATURE)")
    ap.add_argument("-s", "--seed", type=int, default=None, metavar="SEED",
                    help="the seed of a request that gives none; -1: a random one per request (default)")
    ap.add_argument("-n", "--predict", "--n-predict", dest="n_predict", type=int,
                    default=os.environ.get("LLAMA_ARG_N_PREDICT"), metavar="N",
                    help="the tokens to generate for a request that does not say: -1 until the end of its slot; "
                    "default: each endpoint's own (/v1/completions 16, the others -1) (env LLAMA_ARG_N_PREDICT)")
    add_sampler_flags(ap)
    add_upstream_flags(ap)
    ap.add_argument("--metrics", action="store_true", default=_env_flag("ENDPOINT_METRICS"),
                    help="serve Prometheus metrics at /metrics (env LLAMA_ARG_ENDPOINT_METRICS)")
    ap.add_argument("--slots", "--no-slots", dest="slots", action=_OnOff, default=_env_flag("ENDPOINT_SLOTS", True),
                    help="serve /slots and /engine (default: on; env LLAMA_ARG_ENDPOINT_SLOTS)")
    ap.add_argument("--cors-origins", default=A.env_default("CORS_ORIGINS", "*"), metavar="ORIGINS",
                    help="origins a browser page may call the server from: '*' any (the Origin is echoed back, "
                    "credentials allowed), 'localhost' local pages only, or a comma-separated list "
                    "(default: '*', as llama-server; env LLAMA_ARG_CORS_ORIGINS)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    return ap


class _OnOff(argparse.Action):
    """--name turns it on, --no-name off (llama.cpp's paired flags)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def _env_flag(name: str, default: bool = False) -> bool:
    """A boolean LLAMA_ARG_<name>, as llama.cpp reads one (true/1/on/enabled, false/0/off/disabled)."""
    value = A.env_default(name, "").strip().lower()
    return default if not value else value in ("1", "true", "on", "enabled")


def missing_extra() -> str | None:
    """The first package of the server extra that is not installed, or None."""
    for module in ("fastapi", "uvicorn", "sse_starlette", "prometheus_client"):
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


def listening_socket(host: str, port_: int) -> socket.socket:
    """A socket bound to host:port (bound, not listening: connections are refused until uvicorn
    serves). OSError naming the address when it cannot be bound, e.g. a port in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port_))
    except OSError as e:
        sock.close()
        where = f"[{host}]:{port_}" if ":" in host else f"{host}:{port_}"
        raise OSError(e.errno, f"cannot listen on {where}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


ENGINE_SWITCH_INTERVAL_S = 2e-4


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 after a clean shutdown (SIGINT or SIGTERM while serving), 1 when it cannot start,
    2 bad arguments, 130 Ctrl-C while starting."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("server: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    ap = parser()
    ns = ap.parse_args(argv)
    try:  # Llama's rules and messages (pyllama_so.config); -ub defaults to 512, or half of -b with -so 1
        model_params, context_params = A.tool_config(ns, n_ctx=ns.ctx_size, n_seq_max=ns.parallel,
                                                     n_threads_batch=ns.threads_batch or -1, kv_unified=ns.kv_unified)
        params = (dataclasses.replace(model_params, use_mmap=ns.use_mmap), context_params)
        if ns.chat_template and ns.chat_template_file:
            raise ValueError("give --chat-template or --chat-template-file, not both")
        defaults = ServerDefaults(temperature=ns.temperature, seed=ns.seed, n_predict=ns.n_predict,
                                  sampling_fields=sampling_defaults(ap, ns), ignore_eos=ns.ignore_eos)
        cors_options(ns.cors_origins)
    except ValueError as e:
        A.exit_on_flag_error(ap, e)
        print(f"server: error: {e}", file=sys.stderr)
        return 2
    missing = missing_extra()
    if missing:
        print(f"server: {missing} is not installed; the server needs the server extra: {EXTRA}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING if ns.log_disable else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    warn_ignored(ns)
    _llama.set_log_level("info" if ns.verbose else "error")
    step_log = None
    if ns.step_log is not None:
        try:  # before the model: a path that cannot be written is found at once
            step_log = open(ns.step_log, "w", encoding="utf-8")  # closed after serve
        except OSError as e:
            print(f"server: error: --step-log {ns.step_log}: {e.strerror}", file=sys.stderr)
            return 1
    try:
        sock = listening_socket(ns.host, ns.port)  # before the model: a port in use is found at once
    except OSError as e:
        print(f"server: error: {e.strerror}", file=sys.stderr)
        return 1
    try:
        if ns.hf_repo and ns.model:
            print("server: error: give -m or -hf, not both", file=sys.stderr)
            return 2
        if ns.hf_repo:
            from pyllama_so import hub
            try:
                path = hub.download_quant(ns.hf_repo, ns.hf_file)
            except Exception as e:  # huggingface_hub's errors (no network, no such repository, no token) too
                print(f"server: error: -hf {ns.hf_repo}: {e}", file=sys.stderr)
                return 1
        else:
            path = Path(ns.model) if ns.model else cached_model(ns.synthetic)
        if not path.is_file():
            print(f"server: model file not found: {path}", file=sys.stderr)
            return 1
        return serve(ns, path, sock, *params, defaults, step_log)
    except (_llama.LlamaError, ValueError, OSError, ImportError) as e:
        print(f"server: error: {e}", file=sys.stderr)
        return 1
    finally:
        sock.close()
        if step_log is not None:
            step_log.close()


def serve(ns: argparse.Namespace, path: Path, sock: socket.socket, model_params: ModelParams,
          context_params: ContextParams, defaults: ServerDefaults, step_log: TextIO | None = None) -> int:
    import uvicorn

    from pyllama_so.server import chat
    from pyllama_so.server.app import create_app
    from pyllama_so.server.embeddings import EmbeddingService
    from pyllama_so.server.engine import Engine, Step

    class Server(uvicorn.Server):
        """uvicorn's server, on whose first SIGINT or SIGTERM requests get --shutdown-grace seconds (the
        engine drains), on the second they end at once (with their last chunks), and on the third uvicorn
        quits without waiting for them. uvicorn's own handler would raise the signal again once it stopped
        (exit status 130 or 143); a clean shutdown exits 0."""

        signals = 0

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # a signal handler: only flags here, the drain itself runs on the event loop
            self.signals += 1
            grace = ns.shutdown_grace if self.signals == 1 else 0.0
            asyncio.get_running_loop().call_soon_threadsafe(engine.drain, grace)
            self.should_exit = True
            self.force_exit = self.signals > 2

    model = load_model(path, model_params)
    ctx = None
    embedder = None
    try:
        # before the context (its KV cache may take long to allocate): a broken template, or a default
        # --logit-bias token the vocabulary does not have, stops the start
        template = chat.resolve(model, ns.chat_template, ns.chat_template_file)
        _llama.Sampler(model, SamplingParams.from_kwargs(**defaults.sampling())).free()
        ctx = create_context(model, context_params)
        lanes = ctx.split_overlap_stats()
        if ns.split_overlap and not lanes["enabled"]:
            log.warning("split overlap stays off: %s", lanes["reason"])
        embedder = (EmbeddingService.create(model, model_params, context_params, ns.pooling, ns.embd_normalize)
                    if ns.embedding else None)
        on_step = None
        if step_log is not None:  # on the engine thread, while the next step runs
            def on_step(step: Step) -> None:
                step_log.write(json.dumps(step.as_record()) + "\n")
        engine = Engine(ctx, queue_size=ns.queue_size, backend_sampling=ns.backend_sampling,
                        prefill_chunk=ns.prefill_chunk, prefix_share=ns.slot_prompt_similarity, on_step=on_step)
        model_id = ns.alias or path.name
        meta = {"path": str(path), "desc": model.desc, "n_params": model.n_params, "size": model.size,
                "split_mode": ns.split_mode, "split_overlap": ns.split_overlap}
        app = create_app(engine, model_id=model_id, chat=template, api_key=ns.api_key, model_meta=meta,
                         shutdown_grace=ns.shutdown_grace, embeddings=embedder, defaults=defaults,
                         slots_endpoint=ns.slots, metrics_endpoint=ns.metrics, cors_origins=ns.cors_origins)
        host, bound = sock.getsockname()[:2]
        # The engine thread comes back from each step needing the GIL while the HTTP thread streams: waiting out
        # Python's default 5 ms switch interval there would leave the devices idle for it
        sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
        engine.start()
        try:
            log.info("%s: %d slots of %d tokens, n_batch %d, n_ubatch %d, prompt pieces of %d while slots generate, "
                     "chat template %s", model_id, ns.parallel, ctx.n_ctx_seq, ctx.n_batch, ctx.n_ubatch,
                     engine.prefill_chunk, template.name)
            if embedder is not None:
                log.info("embeddings: pooling %s, up to %d tokens per batch", embedder.pooling, embedder.limit)
            log.info("listening on http://%s:%d", f"[{host}]" if ":" in host else host, bound)
            # uvicorn waits for the responses a little longer than the engine's grace, for their last chunks
            config = uvicorn.Config(app, log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=ns.shutdown_grace + 2)
            Server(config).run(sockets=[sock])
        finally:
            engine.stop()
    finally:
        if embedder is not None:
            embedder.free()
        if ctx is not None:
            ctx.free()
        model.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""llama-server's flags that have no counterpart among the bench's model flags, so that a llama-server command
line runs here unchanged where it can: some set what they set there (-tb, -kvu, --no-mmap, -sps,
--log-disable), some ask for what this server always does (--jinja, -cb, --no-webui, ...) and are accepted,
some set a part of llama-server this server does not have (--threads-http, --timeout) and are accepted with
a warning, and the rest are an error that names what is not supported, instead of argparse's "unrecognized
arguments" (or a short flag read as another one with a value: -cb as -c b)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from pyllama_so import args as A

log = logging.getLogger("pyllama_so.server")

# flags that ask for what this server always does
SAME = {
    ("--jinja",): "chat templates always render with Jinja2",
    ("-cb", "--cont-batching"): "batching is always continuous",
    ("--no-webui",): "this server has no web UI",
    ("--offline",): "this server never downloads",
    ("--no-context-shift",): "this server never shifts a slot's context",
    ("--no-warmup",): "this server runs no warm-up decode",
}
# flags with a value for a part of llama-server this server does not have: accepted, with a warning
IGNORED = {
    ("--threads-http",): "uvicorn serves HTTP on one event loop",
    ("-to", "--timeout"): "this server has no read/write timeout of its own",
}
# (names, takes a value): what is not supported
UNSUPPORTED = {
    (("--no-jinja",), False): "llama-server's own template engine",
    (("-nocb", "--no-cont-batching"), False): "batching without continuous batching",
    (("--props",), False): "changing /props with POST",
    (("--mlock",), False): "locking the model in RAM",
    (("--swa-full",), False): "a full-size sliding-window cache",
    (("--context-shift",), False): "context shifting",
    (("-dev", "--device"), True): "choosing devices by name (use CUDA_VISIBLE_DEVICES)",
    (("--keep",), True): "context shifting (n_keep)",
    (("--cache-reuse",), True): "reusing cache chunks by shifting",
    (("--cache-ram", "-cram"), True): "a prompt cache in host memory",
    (("--numa",), True): "NUMA placement",
    (("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx",
      "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast"), True): "RoPE overrides",
    (("--mmproj", "-mm", "--mmproj-url", "-mmu"), True): "multimodal projectors",
    (("-mu", "--model-url"), True): "downloading a model from a URL (give -m FILE, or -hf REPO[:QUANT])",
    (("--chat-template-kwargs",), True): "server-wide chat template arguments (send chat_template_kwargs per request)",
    (("--lora", "--lora-scaled"), True): "LoRA adapters in the server",
    (("-md", "--model-draft", "--draft-max", "--draft", "--draft-n", "--draft-min", "--draft-p-min"), True):
        "speculative decoding",
    (("--slot-save-path",), True): "saving slots to files",
    (("--ssl-key-file", "--ssl-cert-file"), True): "HTTPS (put a reverse proxy in front)",
    (("--api-key-file",), True): "API keys from a file (give --api-key)",
    (("--log-file",), True): "a log file (the log goes to stderr)",
    (("--samplers", "--sampler-seq", "--sampling-seq"), True):
        "a custom sampler order (the chain is llama.cpp's common order, docs/server.md)",
    (("--dynatemp-range", "--dynatemp-exp"), True): "dynamic temperature",
    (("--adaptive-target", "--adaptive-decay"), True): "adaptive-p sampling",
}


class _Unsupported(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, what: str = "", **kw: Any) -> None:
        self.what = what
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"argument {option_string}: not supported by this server ({self.what})")


def _dest(prefix: str, names: tuple[str, ...]) -> str:
    return f"{prefix}_{names[-1].lstrip('-').replace('-', '_')}"


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _reasoning_format(text: str) -> str:
    if text != "none":
        raise argparse.ArgumentTypeError("only 'none' is supported: the answer's reasoning stays in its content")
    return text


def add_upstream_flags(ap: argparse.ArgumentParser) -> None:
    group = ap.add_argument_group("llama-server's flags that set what they set there")
    group.add_argument("-tb", "--threads-batch", type=A.positive_int, default=None, metavar="N",
                       help="CPU threads for prompt batches (default: -t)")
    group.add_argument("-kvu", "--kv-unified", action="store_true",
                       help="one KV buffer for every slot, each able to use all of -c (default: -c / -np per slot)")
    group.add_argument("--no-mmap", dest="use_mmap", action="store_false", help="read the model instead of mapping it")
    group.add_argument("-sps", "--slot-prompt-similarity", type=_share, default=0.1, metavar="F",
                       help="the share of a prompt a slot's cached prefix must hold for the request to take that "
                       "slot over one next to the busy slots; 0: never by prefix (default 0.1)")
    group.add_argument("--log-disable", action="store_true", help="log warnings and errors only")
    group.add_argument("-hf", "-hfr", "--hf-repo", default=A.env_default("HF_REPO", "") or None, metavar="REPO[:QUANT]",
                       help="the model from a Hugging Face repository, instead of -m: the GGUF file of QUANT "
                       "(case-insensitive; default Q4_K_M, else the first), through huggingface_hub's cache "
                       "(the hub extra; env LLAMA_ARG_HF_REPO)")
    group.add_argument("-hff", "--hf-file", default=None, metavar="FILE", help="the file of -hf's repository instead")
    group.add_argument("--reasoning-format", type=_reasoning_format, default="none", metavar="none",
                       help="'none' only: reasoning is not split from the content")
    for names, why in SAME.items():
        group.add_argument(*names, action="store_true", dest=_dest("same", names), help=f"accepted: {why}")
    for names, why in IGNORED.items():
        group.add_argument(*names, dest=_dest("ignored", names), default=None, metavar="N",
                           help=f"accepted and ignored: {why}")
    for (names, valued), what in UNSUPPORTED.items():
        group.add_argument(*names, action=_Unsupported, what=what, nargs=1 if valued else 0, help=argparse.SUPPRESS)


def warn_ignored(ns: argparse.Namespace) -> None:
    """A warning for each accepted flag whose value changes nothing here."""
    for names, why in IGNORED.items():
        if getattr(ns, _dest("ignored", names)) is not None:
            log.warning("%s is ignored: %s", names[-1], why)

"""Random-weight GGUF models of named shapes, for tests and benchmarks.

    python -m pyllama_so.synth qwen3-8b -t f16 -o models/qwen3-8b-f16.gguf
    python -m pyllama_so.synth qwen3-8b -t q4_k_m -o models/qwen3-8b-q4_k_m.gguf
    python -m pyllama_so.synth --list

Weight types: f16, bf16 and q8_0 are written directly. q4_k_m and q4_0 are written as F16 to a
temporary file next to the output, then quantized by llama.cpp's own llama_model_quantize, which
chooses each tensor's type as llama-quantize does (Q6_K for some tensors of q4_k_m, and a 32-block
fallback such as Q5_0 for tensors whose rows are not a multiple of 256).

Weights are drawn from a pool of random values written at random offsets, which keeps the 8B F16
shape fast to write while no tensor is all zeros or a copy of another. The tokenizer is a minimal
SentencePiece-style vocabulary (byte fallback, so any text tokenizes and round-trips).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pyllama_so._llama import FTYPES, LlamaError, quantize_model
from pyllama_so.gguf_writer import GGML_TYPES, TensorSpec, write_gguf


@dataclass(frozen=True)
class Shape:
    """A qwen3-architecture transformer shape."""

    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int = 40960


SHAPES: dict[str, Shape] = {
    # tests: loads and runs in milliseconds on a CPU; head size 64 so that GPU flash attention
    # (required by tensor split) supports it, and two KV heads so that two GPUs get one each
    "tiny": Shape(n_embd=128, n_layer=2, n_ff=256, n_head=2, n_head_kv=2, head_dim=64, n_vocab=512, n_ctx_train=4096),
    # bench default without -m: small enough for a CPU, big enough to measure
    "small": Shape(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=4, head_dim=64, n_vocab=8192),
    # little compute per layer: isolates the fixed cost per ubatch under tensor split
    "overhead": Shape(n_embd=1024, n_layer=36, n_ff=2048, n_head=8, n_head_kv=8, head_dim=128, n_vocab=151936),
    "qwen3-8b": Shape(n_embd=4096, n_layer=36, n_ff=12288, n_head=32, n_head_kv=8, head_dim=128, n_vocab=151936),
    "qwen3-32b": Shape(n_embd=5120, n_layer=64, n_ff=25600, n_head=64, n_head_kv=8, head_dim=128, n_vocab=151936),
}

# The weight types: written directly from pools of random encoded values, or written as F16 and
# quantized by llama.cpp (its K-quant code, not ours).
DIRECT_TYPES = ("f16", "bf16", "q8_0")
QUANTIZED_TYPES = ("q4_k_m", "q4_0")
WEIGHT_TYPES = DIRECT_TYPES + QUANTIZED_TYPES

_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_BYTE = 1, 2, 3, 6
_SPACE = "\u2581"  # SentencePiece's visible space


def vocabulary(n_vocab: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Tokens, scores and token types of a byte-fallback SentencePiece-style vocabulary of n_vocab."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_CONTROL] + [_TOKEN_BYTE] * 256
    pieces = [_SPACE] + [chr(c) for c in range(33, 127)] + [_SPACE + chr(c) for c in range(33, 127)]
    i = 0
    while len(tokens) + len(pieces) < n_vocab:  # filler pieces up to the embedding size
        pieces.append(f"{_SPACE}w{i}")
        i += 1
    if len(tokens) + len(pieces) > n_vocab:
        pieces = pieces[: max(0, n_vocab - len(tokens))]
    if len(tokens) + len(pieces) != n_vocab:
        raise ValueError(f"n_vocab {n_vocab} is too small for the byte-fallback vocabulary (>= 259)")
    tokens += pieces
    types += [_TOKEN_NORMAL] * len(pieces)
    # longer pieces score higher so that merges prefer them
    scores = np.array([0.0] * 259 + [-1000.0 + len(p) for p in pieces], dtype=np.float32)
    return tokens, scores, np.array(types, dtype=np.int32)


def metadata(shape: Shape, weight_type: str, name: str) -> dict[str, object]:
    arch = "qwen3"
    tokens, scores, types = vocabulary(shape.n_vocab)
    return {
        "general.architecture": arch,
        "general.name": f"synthetic {arch} {name}",  # the bench's model column (llama.cpp would guess a size)
        "general.file_type": FTYPES[weight_type],
        f"{arch}.context_length": shape.n_ctx_train,
        f"{arch}.embedding_length": shape.n_embd,
        f"{arch}.block_count": shape.n_layer,
        f"{arch}.feed_forward_length": shape.n_ff,
        f"{arch}.attention.head_count": shape.n_head,
        f"{arch}.attention.head_count_kv": shape.n_head_kv,
        f"{arch}.attention.key_length": shape.head_dim,
        f"{arch}.attention.value_length": shape.head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 1000000.0,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }


def tensors(shape: Shape, weight_type: str) -> list[TensorSpec]:
    """The qwen3 tensor set; 1-D norms stay F32 as in converted models."""
    e, hd, ff = shape.n_embd, shape.head_dim, shape.n_ff
    q, kv = shape.n_head * hd, shape.n_head_kv * hd
    w = weight_type
    out = [TensorSpec("token_embd.weight", (e, shape.n_vocab), w), TensorSpec("output_norm.weight", (e,), "f32"),
           TensorSpec("output.weight", (e, shape.n_vocab), w)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        out += [
            TensorSpec(b + "attn_norm.weight", (e,), "f32"),
            TensorSpec(b + "attn_q.weight", (e, q), w),
            TensorSpec(b + "attn_k.weight", (e, kv), w),
            TensorSpec(b + "attn_v.weight", (e, kv), w),
            TensorSpec(b + "attn_output.weight", (q, e), w),
            TensorSpec(b + "attn_q_norm.weight", (hd,), "f32"),
            TensorSpec(b + "attn_k_norm.weight", (hd,), "f32"),
            TensorSpec(b + "ffn_norm.weight", (e,), "f32"),
            TensorSpec(b + "ffn_gate.weight", (e, ff), w),
            TensorSpec(b + "ffn_up.weight", (e, ff), w),
            TensorSpec(b + "ffn_down.weight", (ff, e), w),
        ]
    return out


class _RandomPool:
    """Pools of random encoded values per (type, scale); each tensor is cut from random offsets.

    Weights are N(0, (gain / sqrt(fan_in))^2), so activations keep their scale through the layers:
    a deep random model then stays numerically tame, and GPU/CPU results can be compared closely.
    1-D tensors (norm weights) are 1 + N(0, 0.1^2).
    """

    POOL_ELEMENTS = 1 << 23  # 8 Mi values: 16 MiB at 16 bits
    GAIN = 0.5

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.unit = self.rng.standard_normal(self.POOL_ELEMENTS, dtype=np.float32)
        self.pools: dict[tuple[str, float], bytes] = {}

    def _pool(self, ggml_type: str, stdev: float) -> bytes:
        key = (ggml_type, stdev)
        if key not in self.pools:
            if ggml_type == "f32":
                data = (1.0 + 0.1 * self.unit).astype("<f4").tobytes()
            elif ggml_type == "f16":
                data = (self.unit * stdev).astype("<f2").tobytes()
            elif ggml_type == "bf16":
                data = ((self.unit * np.float32(stdev)).view("<u4") >> 16).astype("<u2").tobytes()
            else:  # q8_0: blocks of an f16 scale and 32 int8 quants
                blocks = np.empty(self.POOL_ELEMENTS // 32, dtype=[("d", "<f2"), ("qs", "i1", 32)])
                blocks["d"] = stdev * 3.0 / 127.0
                blocks["qs"] = np.clip(np.rint(self.unit.reshape(-1, 32) * 127.0 / 3.0), -127, 127)
                data = blocks.tobytes()
            self.pools[key] = data
        return self.pools[key]

    def write(self, spec: TensorSpec, f: BinaryIO) -> None:
        stdev = self.GAIN / float(np.sqrt(spec.shape[0])) if len(spec.shape) > 1 else 1.0
        pool = memoryview(self._pool(spec.ggml_type, stdev))
        unit = GGML_TYPES[spec.ggml_type][2]  # write whole values/blocks
        left = spec.nbytes
        chunk = 0
        while left:
            n = min(left, len(pool) // 2 // unit * unit)
            start = int(self.rng.integers(0, (len(pool) - n) // unit + 1)) * unit
            piece = pool[start:start + n]
            if spec.name == "output.weight" and chunk:
                f.write(self._scaled(piece, spec.ggml_type, 1.0 + chunk / 512.0))
            else:
                f.write(piece)
            left -= n
            chunk += 1

    @staticmethod
    def _scaled(piece: memoryview, ggml_type: str, factor: float) -> bytes:
        """A chunk of the output matrix with its values times factor. Two chunks cut at offsets a whole number
        of rows apart hold the same rows; in the output matrix such twins give tokens equal logits (a
        quarter of a Q8_0 vocabulary had a twin, ties in every row's top 40), which no trained model has.
        A factor per chunk keeps every row distinct."""
        if ggml_type == "q8_0":
            blocks = np.frombuffer(piece, dtype=[("d", "<f2"), ("qs", "i1", 32)]).copy()
            blocks["d"] = (blocks["d"].astype(np.float32) * factor).astype("<f2")
            return blocks.tobytes()
        if ggml_type == "f16":
            return (np.frombuffer(piece, "<f2").astype(np.float32) * factor).astype("<f2").tobytes()
        if ggml_type == "bf16":
            x = (np.frombuffer(piece, "<u2").astype(np.uint32) << 16).view(np.float32) * np.float32(factor)
            return (x.view(np.uint32) >> 16).astype("<u2").tobytes()
        raise ValueError(f"no scaling for the output matrix in {ggml_type}")


# -- LoRA adapters for the synthetic shapes -------------------------------------------------------

def lora_weights(shape_name: str = "tiny", targets: tuple[str, ...] = ("output.weight",), rank: int = 4, *,
                 seed: int = 0, stdev: float = 0.05) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random LoRA factors for weights of a synthetic shape: name -> (A, B) as float32 numpy arrays of
    shapes (rank, n_in) and (n_out, rank), so that the adapted weight computes W x + scale * B (A x)."""
    _check_names(shape_name, "f16")
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    by_name = {t.name: t for t in tensors(SHAPES[shape_name], "f16")}
    rng = np.random.default_rng(seed)
    out = {}
    for name in targets:
        spec = by_name.get(name)
        if spec is None or len(spec.shape) != 2 or name == "token_embd.weight":
            raise ValueError(f"no 2-D weight {name!r} to adapt in shape {shape_name!r} (token_embd is not supported)")
        n_in, n_out = spec.shape  # ggml order: ne0 is the input
        out[name] = ((rng.standard_normal((rank, n_in)) * stdev).astype(np.float32),
                     (rng.standard_normal((n_out, rank)) * stdev).astype(np.float32))
    return out


def write_lora(path: Path | str, weights: dict[str, tuple[np.ndarray, np.ndarray]], *, arch: str = "qwen3",
               alpha: float | None = None) -> Path:
    """A LoRA adapter GGUF as llama.cpp's llama_adapter_lora_init reads it: general.type "adapter",
    adapter.type "lora", the base model's architecture, and "<weight>.lora_a" / "<weight>.lora_b" F32
    tensors (ggml shapes (n_in, rank) and (rank, n_out)). With alpha, llama.cpp scales by alpha / rank."""
    path = Path(path)
    meta: dict[str, object] = {"general.architecture": arch, "general.type": "adapter",
                               "general.name": "synthetic LoRA", "adapter.type": "lora"}
    if alpha is not None:
        meta["adapter.lora.alpha"] = float(alpha)
    specs, data = [], {}
    for name, (a, b) in weights.items():
        a32, b32 = np.ascontiguousarray(a, dtype="<f4"), np.ascontiguousarray(b, dtype="<f4")
        if a32.ndim != 2 or b32.ndim != 2 or a32.shape[0] != b32.shape[1]:
            raise ValueError(f"{name}: A (rank, n_in) and B (n_out, rank) do not match: {a32.shape}, {b32.shape}")
        for suffix, arr in ((".lora_a", a32), (".lora_b", b32)):
            specs.append(TensorSpec(name + suffix, (arr.shape[1], arr.shape[0]), "f32"))
            data[name + suffix] = arr.tobytes()
    write_gguf(path, meta, specs, lambda spec, f: f.write(data[spec.name]))
    return path


def default_cache_dir() -> Path:
    base = os.environ.get("PYLLAMA_SO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pyllama_so")
    return Path(base) / "models"


def _check_names(shape_name: str, weight_type: str) -> None:
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; expected one of {list(SHAPES)}")
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"unknown weight type {weight_type!r}; expected one of {', '.join(WEIGHT_TYPES)}")


def write_model(path: Path | str, shape_name: str = "tiny", weight_type: str = "f16", *, seed: int = 0,
                quiet: bool = False, chat_template: str | None = None,
                extra_metadata: Mapping[str, object] | None = None) -> Path:
    """Write a synthetic model; return its path. chat_template: a Jinja text written as the model's
    tokenizer.chat_template (default: none, so chat falls back to llama.cpp's chatml); extra_metadata: more
    GGUF keys (e.g. tokenizer.ggml.fim_pre_token_id), over the generated ones.

    A quantized type is written as F16 to a temporary file next to path first (so that folder needs
    room for both), which is removed afterwards, also on failure or Ctrl-C. llama_model_quantize has
    no abort callback: Ctrl-C during quantization takes effect when it returns.
    """
    _check_names(shape_name, weight_type)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if weight_type in DIRECT_TYPES:
        _write_direct(path, shape_name, weight_type, seed, quiet, path.name, chat_template, extra_metadata)
        return path
    f16 = path.with_name(f"{path.name}.f16-{os.getpid()}.tmp")
    part = path.with_name(f"{path.name}.{os.getpid()}.part")  # never a half-quantized file under the final name
    try:
        _write_direct(f16, shape_name, "f16", seed, quiet, f"{path.name}: f16", chat_template, extra_metadata)
        if not quiet:
            print(f"synth: {path.name}: quantizing to {weight_type} with llama.cpp", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        quantize_model(f16, part, weight_type)
        part.replace(path)
        if not quiet:
            size = path.stat().st_size
            shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
            print(f"synth: {path.name}: quantized in {time.monotonic() - t0:.1f} s ({shown})", file=sys.stderr)
    finally:
        for tmp in (f16, part):
            tmp.unlink(missing_ok=True)
    return path


def _write_direct(path: Path, shape_name: str, weight_type: str, seed: int, quiet: bool, label: str,
                  chat_template: str | None = None, extra_metadata: Mapping[str, object] | None = None) -> None:
    shape = SHAPES[shape_name]
    specs = tensors(shape, weight_type)
    pool = _RandomPool(seed)
    t0 = time.monotonic()
    last = [0.0]
    tty = sys.stderr.isatty()  # a terminal redraws one line; a log gets one line per update

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if not quiet and (now - last[0] > 1.0 or done == total):
            last[0] = now
            text = f"synth: {label}: {done / 2**30:6.2f} / {total / 2**30:.2f} GiB"
            print("\r" + text if tty else text, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        meta = metadata(shape, weight_type, shape_name)
        if chat_template is not None:
            meta["tokenizer.chat_template"] = chat_template
        meta.update(extra_metadata or {})
        write_gguf(path, meta, specs, pool.write, progress)
    except BaseException:
        if last[0] and tty:
            print(file=sys.stderr)  # end the progress line before the error
        raise
    if not quiet:
        took = f"{time.monotonic() - t0:.1f} s"
        print(f" in {took}" if tty else f"synth: {label}: written in {took}", file=sys.stderr)


# Part of a cached model's name: raise it when the shapes, the weights or the metadata written change,
# so that a model cached by an older version is not reused (3: general.name "synthetic <arch> <shape>";
# 4: no two rows of the output matrix alike).
CACHE_VERSION = 4


def cached_model(shape_name: str = "small", weight_type: str = "f16") -> Path:
    """The cached synthetic model of a shape and weight type, written on first use (older versions of
    it are removed)."""
    _check_names(shape_name, weight_type)
    cache = default_cache_dir()
    path = cache / f"{shape_name}-{weight_type}-v{CACHE_VERSION}.gguf"
    if not path.exists():
        write_model(path, shape_name, weight_type)
        for version in range(1, CACHE_VERSION):  # the larger shapes take GiBs each
            cache.joinpath(f"{shape_name}-{weight_type}-v{version}.gguf").unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.synth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", choices=list(SHAPES), help="model shape")
    # checked below rather than by choices=, so that a bad name is one line, not usage + error
    ap.add_argument("-t", "--type", default="f16", metavar="TYPE",
                    help=f"weight type: {', '.join(DIRECT_TYPES)} (written directly) or {', '.join(QUANTIZED_TYPES)} "
                         "(F16 quantized by llama.cpp); default f16")
    ap.add_argument("-o", "--output", type=Path, help="output file (default: the cache, see --list)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="overwrite an existing file")
    ap.add_argument("--list", action="store_true", help="list the shapes and the cache folder")
    args = ap.parse_args(argv)

    if args.list or args.shape is None:
        print(f"cache: {default_cache_dir()}")
        for name, s in SHAPES.items():
            n = sum(t.n_elements for t in tensors(s, "f16"))
            print(f"  {name:10s} {n:>14,} params  n_embd={s.n_embd} n_layer={s.n_layer} n_ff={s.n_ff} "
                  f"heads={s.n_head}/{s.n_head_kv} vocab={s.n_vocab}")
        return 0 if args.list else 2
    if args.type not in WEIGHT_TYPES:
        print(f"synth: error: unknown weight type {args.type!r}; expected one of {', '.join(WEIGHT_TYPES)}",
              file=sys.stderr)
        return 2
    out = args.output or default_cache_dir() / f"{args.shape}-{args.type}.gguf"
    if out.exists() and not args.force:
        print(f"synth: {out} exists (use --force to overwrite)", file=sys.stderr)
        print(out)
        return 0
    try:
        print(write_model(out, args.shape, args.type, seed=args.seed))
    except OSError as e:
        print(f"synth: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    except LlamaError as e:  # quantization failed: the message says why
        print(f"synth: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

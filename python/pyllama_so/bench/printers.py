"""Result printers with llama-bench's formats: md, csv, json, jsonl."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import Any, TextIO

from pyllama_so import __version__, _build_info
from pyllama_so.bench.runner import DEFAULTS, BenchParams, TestResult, backend_name, cpu_info, gpu_info


def tensor_split_str(ts: Sequence[float] | None) -> str:
    """As llama-bench writes it: %.2f per device up to the last non-zero one ("0.00" when none)."""
    ts = ts or ()
    last = max((i for i, v in enumerate(ts) if v > 0), default=0)
    return "/".join(f"{v:.2f}" for v in (ts or (0.0,))[: last + 1])


def attn_split_str(a: Sequence[float] | None) -> str:
    """-as as tensor_split_str writes -ts; "-" when it follows the tensor split."""
    return tensor_split_str(a) if a else "-"


def fields(r: TestResult) -> dict[str, Any]:
    """One result as llama-bench's JSON fields (plus ours: warmup_runs, allreduce_calls, split_overlap,
    host_ms_per_ubatch, rpc_servers; markdown shows none of them, as llama-bench's table)."""
    return {
        "build_commit": _build_info.UPSTREAM_COMMIT[:9],
        "build_number": 0,
        "pyllama_so_version": __version__,
        "cpu_info": cpu_info(),
        "gpu_info": gpu_info(),
        "backends": backend_name(bool(r.model.rpc_servers)),
        "model_filename": r.model_path,
        "model_type": r.model_type,
        "model_size": r.model_size,
        "model_n_params": r.model_n_params,
        "n_batch": r.ctx.n_batch,
        "n_ubatch": r.ctx.n_ubatch,
        "n_threads": r.ctx.n_threads,
        "type_k": r.ctx.type_k,
        "type_v": r.ctx.type_v,
        "n_gpu_layers": r.model.n_gpu_layers,
        "split_mode": r.model.split_mode,
        "main_gpu": r.model.main_gpu,
        "flash_attn": r.ctx.flash_attn,
        "tensor_split": tensor_split_str(r.model.tensor_split),
        "attn_split": attn_split_str(r.model.attn_split),
        "n_prompt": r.test.n_prompt,
        "n_gen": r.test.n_gen,
        "n_depth": r.test.n_depth,
        "test_time": r.test_time,
        "avg_ns": r.avg_ns,
        "stddev_ns": r.stddev_ns,
        "avg_ts": r.avg_ts,
        "stddev_ts": r.stddev_ts,
        "samples_ns": r.samples_ns,
        "samples_ts": r.samples_ts,
        "warmup_runs": r.warmup_runs,
        "allreduce_calls": r.allreduce_calls,
        "split_overlap": r.split_overlap,
        "host_ms_per_ubatch": r.host_ms_per_ubatch,
        "rpc_servers": list(r.model.rpc_servers or ()),
    }


class Printer:
    def __init__(self, out: TextIO, params: BenchParams) -> None:
        self.out = out
        self.params = params

    def header(self) -> None: ...

    def result(self, r: TestResult) -> None: ...

    def footer(self) -> None: ...


class JsonPrinter(Printer):
    def header(self) -> None:
        self.first = True
        self.out.write("[\n")

    def result(self, r: TestResult) -> None:
        text = json.dumps(fields(r), indent=2)
        self.out.write(("" if self.first else ",\n") + "  " + text.replace("\n", "\n  "))
        self.first = False
        self.out.flush()

    def footer(self) -> None:
        self.out.write("\n]\n")


class JsonlPrinter(Printer):
    def result(self, r: TestResult) -> None:
        self.out.write(json.dumps(fields(r)) + "\n")
        self.out.flush()


class CsvPrinter(Printer):
    def header(self) -> None:
        self.writer: csv.DictWriter[str] | None = None

    def result(self, r: TestResult) -> None:
        row = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in fields(r).items()}
        if self.writer is None:
            self.writer = csv.DictWriter(self.out, fieldnames=list(row))
            self.writer.writeheader()
        self.writer.writerow(row)
        self.out.flush()


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


class MarkdownPrinter(Printer):
    # (column title, BenchParams axis, value of a result); shown when the axis is not at its default
    OPTIONAL = [
        ("threads", "n_threads", lambda r: str(r.ctx.n_threads)),
        ("n_batch", "n_batch", lambda r: str(r.ctx.n_batch)),
        ("n_ubatch", "n_ubatch", lambda r: str(r.ctx.n_ubatch)),
        ("type_k", "type_k", lambda r: r.ctx.type_k),
        ("type_v", "type_v", lambda r: r.ctx.type_v),
        ("main_gpu", "main_gpu", lambda r: str(r.model.main_gpu)),
        ("sm", "split_mode", lambda r: r.model.split_mode),
        ("ts", "tensor_split", lambda r: tensor_split_str(r.model.tensor_split)),
        ("as", "attn_split", lambda r: attn_split_str(r.model.attn_split)),
        ("fa", "flash_attn", lambda r: r.ctx.flash_attn),
        ("so", "split_overlap", lambda r: str(int(r.ctx.split_overlap))),
    ]

    def header(self) -> None:
        cpu = backend_name(bool(self.params.rpc_servers)) == "CPU"
        self.cols: list[tuple[str, Any]] = [
            ("model", lambda r: r.model_type), ("size", lambda r: _size(r.model_size)),
            ("params", lambda r: _params(r.model_n_params)),
            ("backend", lambda r: backend_name(bool(r.model.rpc_servers)))]
        if not cpu:
            self.cols.append(("ngl", lambda r: str(r.model.n_gpu_layers)))
        for title, axis, get in self.OPTIONAL:
            values = getattr(self.params, axis)
            if axis == "n_threads":  # the default depends on the machine: shown for CPU runs, as llama-bench
                show = cpu or len(values) > 1
            elif values is None:  # n_ubatch by default: 512, or half of -b for -so 1 rows
                show = any(self.params.split_overlap)
            else:
                show = len(values) > 1 or values != getattr(DEFAULTS, axis)
            if show:
                self.cols.append((title, get))
        self.cols += [("test", lambda r: r.test.name), ("t/s", lambda r: f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}")]
        self.titled = False

    def result(self, r: TestResult) -> None:
        row = [get(r) for _, get in self.cols]
        if not self.titled:
            self.titled = True
            self._line([t for t, _ in self.cols])
            self._line(["-" * max(3, len(t) - 1) + ":" for t, _ in self.cols])
        self._line(row)
        self.out.flush()

    def _line(self, cells: list[str]) -> None:
        self.out.write("| " + " | ".join(cells) + " |\n")


PRINTERS: dict[str, type[Printer]] = {"md": MarkdownPrinter, "csv": CsvPrinter, "json": JsonPrinter,
                                      "jsonl": JsonlPrinter}

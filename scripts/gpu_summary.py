"""Print the short table that ends scripts/gpu-check, from the files it wrote into OUT."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def _ratio(x: float | None, missing: str = "") -> str:
    return missing if x is None else f"{x:.2f}"


def main() -> int:
    out = Path(sys.argv[1])
    logits = out / "logits.jsonl"
    if logits.exists():
        print("\n| CUDA split mode vs CPU build | NMSE | argmax agree |\n|---|---:|---:|")
        for line in logits.read_text().splitlines():
            r = json.loads(line)
            print(f"| {Path(r['output']).stem} | {r['nmse']:.2e} | {r['argmax_agree']:.3f} |")
    bench = out / "bench.jsonl"
    if bench.exists():
        rows: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for line in bench.read_text().splitlines():
            r = json.loads(line)
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            sm = str(r["split_mode"]).replace("LLAMA_SPLIT_MODE_", "").lower()
            rows[(sm, test)][r["tool"]].append(r["avg_ts"])
        print("\n| sm | test | upstream llama-bench t/s | pyllama_so.bench t/s | ours/upstream |"
              "\n|---|---|---:|---:|---:|")
        for (sm, test), v in rows.items():
            up = sum(v["upstream"]) / len(v["upstream"]) if v.get("upstream") else None
            ours = sum(v["ours"]) / len(v["ours"]) if v.get("ours") else None
            ratio = f"{ours / up:.3f}" if up and ours else "n/a"
            print(f"| {sm} | {test} | {up or float('nan'):.1f} | {ours or float('nan'):.1f} | {ratio} |")
    ar = out / "allreduce.json"
    rep = json.loads(ar.read_text()) if ar.exists() else {}
    if "skipped" in rep:
        print(f"\nAllReduce alone: {rep['skipped']}")
    elif rep:
        res = rep.get("results", {})
        sizes = rep.get("sizes", [])
        print("\nAllReduce alone, payload = BF16 bytes. Rows: ceiling µs, then each path's ceiling time / its time;"
              " host = µs to issue one reduction")
        print("| path | " + " | ".join(f"{s >> 10} KiB" for s in sizes) + " | host µs at 8 MiB |")
        print("|---|" + "---:|" * (len(sizes) + 1))
        k8 = sizes.index(8 << 20) if (8 << 20) in sizes else len(sizes) - 1
        for name, r in res.items():
            if "us" not in r:
                continue
            if name == "ceiling":
                cells = [f"{t:.0f} µs" for t in r["us"]]
            else:
                cells = [_ratio(x) for x in r.get("ratio_to_ceiling", [])]
            host = (r.get("host_us") or [None] * len(sizes))[k8]
            print(f"| {name} | " + " | ".join(cells) + f" | {'' if host is None else f'{host:.0f}'} |")
        queued = {n: r["queued_ratio_to_ceiling"] for n, r in res.items()
                  if any(x is not None for x in r.get("queued_ratio_to_ceiling") or [])}
        if queued:
            print("GPU time alone (reductions queued before the GPUs start; host issue time left out), ceiling / time:")
            for name, ratios in queued.items():
                print(f"  {name}: " + " ".join(_ratio(x, "-") for x in ratios))
        base = res.get("nccl_nop2p", {}).get("us")
        if base:
            print("NCCL_P2P_DISABLE=1 time / copy-engine time:")
            for name in [n for n in res if (n.startswith("ce_") or n == "ce") and "us" in res[n]]:
                print(f"  {name}: " + " ".join(f"{b / t:.2f}" for b, t in zip(base, res[name]["us"], strict=True)))
        for name, r in res.items():
            for key in ("error", "warning"):
                if key in r:
                    print(f"{name}: {key}: {r[key]}")
    tp = out / "tpbench.jsonl"
    if tp.exists():
        runs: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        paths: dict[str, set[str]] = defaultdict(set)
        tools: list[str] = []
        for line in tp.read_text().splitlines():
            r = json.loads(line)
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            runs[(r["n_ubatch"], test)][r["tool"]].append(r["avg_ts"])
            paths[r["tool"]].update(r.get("allreduce_calls", {}))
            if r["tool"] not in tools:
                tools.append(r["tool"])
        others = [t for t in tools if t != "nccl"]
        print("\n-sm tensor -b 2048, no peer access emulated (NCCL_P2P_DISABLE=1); mean of the runs' avg t/s")
        print("AllReduce paths seen: " + "; ".join(f"{t} {sorted(paths[t])}" for t in tools))
        print("| -ub | test | " + " | ".join(tools) + " | " + " | ".join(f"{t}/nccl" for t in others) + " |")
        print("|---:|---|" + "---:|" * (len(tools) + len(others)))
        for (ub, test), v in sorted(runs.items()):
            mean = {t: (sum(v[t]) / len(v[t]) if v.get(t) else float("nan")) for t in tools}
            nccl = mean.get("nccl", float("nan"))
            cells = [f"{mean[t]:.1f}" for t in tools] + [f"{mean[t] / nccl:.3f}" for t in others]
            print(f"| {ub} | {test} | " + " | ".join(cells) + " |")
    for name, title in (("sobench.jsonl", "split overlap, two CUDA devices on one GPU, copy engines forced"),
                        ("so2bench.jsonl", "split overlap, two GPUs, no peer access emulated, copy engines forced")):
        path = out / name
        if not path.exists():
            continue
        print(f"\n{title}: -b 2048; avg t/s ± stddev; host ms per ubatch; graph builds and ubatches per lane")
        print("| config | -ub | test | t/s | host ms/ubatch | builds | ubatches |\n|---|---:|---|---:|---:|---|---|")
        for line in path.read_text().splitlines():
            r = json.loads(line)
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            so = r.get("split_overlap") or {}
            host = r.get("host_ms_per_ubatch")
            print(f"| {r['tool']} | {r['n_ubatch']} | {test} | {r['avg_ts']:.1f} ± {r.get('stddev_ts', 0):.1f} | "
                  f"{'' if host is None else f'{host:.2f}'} | {so.get('graph_builds', '')} "
                  f"| {so.get('ubatches', '')} |")
    decode = out / "decode.jsonl"
    if decode.exists():
        print("\ndecode, no peer access emulated, copy engines forced: avg t/s ± stddev per round; host ms per token;"
              " AllReduce calls by path")
        print("| model | config | round | t/s | host ms/token | AllReduce calls |\n|---|---|---:|---:|---:|---|")
        for line in decode.read_text().splitlines():
            r = json.loads(line)
            host = r.get("host_ms_per_ubatch")
            calls = ", ".join(f"{k} {v}" for k, v in sorted((r.get("allreduce_calls") or {}).items()) if v)
            print(f"| {r['shape']} | {r['tool']} | {r['round']} | {r['avg_ts']:.1f} ± {r.get('stddev_ts', 0):.1f} | "
                  f"{'' if host is None else f'{host:.3f}'} | {calls} |")
    for vram in (out / "sobench-vram.txt",):
        if vram.exists():
            print("\n" + vram.read_text().strip())
    scenario = out / "server-scenario.md"  # scripts/server-scenario's table, as it printed it
    if scenario.exists():
        print("\nserver scenario, -sm tensor --parallel 2, copy engines forced:\n" + scenario.read_text().strip())
    load = out / "server-load.md"  # scripts/server-load's tables, as it printed them
    if load.exists():
        print("\nserver load, ours and llama-server with the same model and flags:\n" + load.read_text().strip())
    gen, load_json = out / "generation.json", out / "server-load.json"
    if gen.exists() and load_json.exists():
        # the servers' decoding while every stream generates, against the context's own steps of as many sequences
        context_rates = {d["streams"]: d for d in json.loads(gen.read_text()).get("decode", [])}
        load_runs = [r for r in json.loads(load_json.read_text()).get("runs", [])
                     if r.get("scenario") == "load" and r.get("concurrency") in context_rates]
        if load_runs:
            print("\nserver decoding while all C streams generate, against the context's decode of C sequences")
            print("| server | C | decode tok/s, all C | raw with outputs t/s | / raw with outputs | raw t/s | / raw |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for r in load_runs:
                d, tps = context_rates[r["concurrency"]], r.get("full_decode_tps")
                outs, raw = (d.get(m, {}).get("mean") for m in ("outputs", "raw"))
                print(f"| {r['server']} | {r['concurrency']} | {'' if tps is None else f'{tps:.1f}'} | "
                      f"{'' if outs is None else f'{outs:.1f}'} | {_ratio(tps and outs and tps / outs)} | "
                      f"{'' if raw is None else f'{raw:.1f}'} | {_ratio(tps and raw and tps / raw)} |")
    memcheck = out / "memcheck.txt"
    if memcheck.exists():
        print("\n" + memcheck.read_text().strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

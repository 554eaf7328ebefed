"""Draw a GPU timeline (kernels and copies per device and stream) from an Nsight Systems SQLite export
or from the CSV of tools/cupti-trace, to see whether the two split-overlap lanes overlap; print how busy
each device was.

    nsys profile -t cuda -o prof python -m pyllama_so.bench -m M -sm tensor -so 1 -ub 1024 -p 2048 -n 0 -r 1
    nsys export --type sqlite -o prof.sqlite prof.nsys-rep
    scripts/so-timeline prof.sqlite -o timeline.png --window-ms 40

    CUDA_INJECTION64_PATH=libcupti-trace.so CUPTI_TRACE_OUT=prof.csv python -m pyllama_so.bench ...
    scripts/so-timeline prof.csv -o timeline.png --window-ms 40      # .csv or .csv.gz

Each row is one CUDA stream of one device; kernels are drawn in the row's colour, device-to-host and
host-to-device copies (the copy engines) as hatched bars. A CSV also holds the CUDA runtime calls of each
host thread: one row per thread, synchronizing calls in red. The window is the last --window-ms before
the last kernel (or before --end-ms), so the steady state shows, not start-up. Per device, the summary
gives the share of the window with a kernel running (busy), with kernels of two or more streams running
at once (overlap), and with a copy in flight; per host thread, the share spent in synchronizing calls.
--top-kernels N adds the kernels with the most time in the window; --steps-d2h BYTES cuts the window into
decode steps at each device-to-host copy of at least BYTES (a step's logits) and adds the mean period, the
copy's time, and per device the kernel time and the gap from the copy's end to its next kernel;
--write-window CSV keeps the window's records of a CSV trace (small enough to bring back from a machine).
Needs matplotlib for the picture; --no-plot prints the summary alone.
"""
from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import sqlite3
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

COPY_KINDS = {1: "H2D", 2: "D2H", 8: "D2D", 10: "P2P"}  # CUPTI_ACTIVITY_MEMCPY_KIND


Span = tuple[int, int, int, int, str]  # start ns, end ns, device (or host thread), stream, name
Copy = tuple[int, int, int, int, str, int]  # a Span and the bytes copied (0 where the export has none)


def load_csv(path: Path) -> tuple[list[Span], list[Copy], list[Span]]:
    """Kernels, copies and runtime API calls of a tools/cupti-trace CSV."""
    kernels: list[Span] = []
    copies: list[Copy] = []
    calls: list[Span] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            span = (int(row["start_ns"]), int(row["end_ns"]), int(row["device"]), int(row["stream"]), row["name"])
            if row["kind"] == "memcpy":
                copies.append(span + (int(row["bytes"]),))
            else:
                {"kernel": kernels, "api": calls}.get(row["kind"], []).append(span)
    return kernels, copies, calls


def load(db: Path) -> tuple[list[Span], list[Copy], list[Span]]:
    """Kernels, copies (name: H2D, D2H, ...) and runtime API calls (none in an nsys export here)."""
    if db.suffix in (".csv", ".gz"):
        return load_csv(db)
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    kernels: list[tuple[int, int, int, int, str]] = []
    copies: list[Copy] = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        names = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        for start, end, dev, stream, short in con.execute(
                "SELECT start, end, deviceId, streamId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"):
            kernels.append((start, end, dev, stream, names.get(short, str(short))))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        columns = {r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_MEMCPY)")}
        size = "bytes" if "bytes" in columns else "0"
        for start, end, dev, stream, kind, nbytes in con.execute(
                f"SELECT start, end, deviceId, streamId, copyKind, {size} FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
            copies.append((start, end, dev, stream, COPY_KINDS.get(kind, str(kind)), nbytes))
    con.close()
    return kernels, copies, []


def union_ns(spans: list[tuple[int, int]], lo: int, hi: int, min_depth: int = 1) -> int:
    """Nanoseconds of [lo, hi) covered by at least min_depth of the spans at once."""
    edges = sorted([(max(s, lo), 1) for s, e in spans if e > lo and s < hi] +
                   [(min(e, hi), -1) for s, e in spans if e > lo and s < hi])
    total, depth, since = 0, 0, lo
    for t, step in edges:
        if depth >= min_depth:
            total += t - since
        depth += step
        since = t
    return total


def summary(kernels: list[Span], copies: list[Copy], calls: list[Span], lo: int, hi: int) -> list[str]:
    width = hi - lo
    lines = []
    for dev in sorted({k[2] for k in kernels}):
        ks = [k for k in kernels if k[2] == dev]
        busy = union_ns([(k[0], k[1]) for k in ks], lo, hi)
        # kernels of different streams at once: per stream unions first, then depth 2 over those
        per_stream = defaultdict(list)
        for k in ks:
            per_stream[k[3]].append((k[0], k[1]))
        merged = [span for spans in per_stream.values() for span in merge(spans)]
        both = union_ns(merged, lo, hi, 2)
        copy = union_ns([(c[0], c[1]) for c in copies if c[2] == dev], lo, hi)
        lines.append(f"GPU{dev}: busy {100 * busy / width:.1f} %, two streams at once {100 * both / width:.1f} %, "
                     f"copies in flight {100 * copy / width:.1f} % of {width / 1e6:.1f} ms")
    for thread in sorted({c[2] for c in calls}):
        cs = [c for c in calls if c[2] == thread]
        inside = union_ns([(c[0], c[1]) for c in cs], lo, hi)
        if inside == 0:
            continue
        sync = union_ns([(c[0], c[1]) for c in cs if "ynchronize" in c[4]], lo, hi)
        lines.append(f"host thread {thread}: in CUDA calls {100 * inside / width:.1f} %, "
                     f"in synchronizing calls {100 * sync / width:.1f} %")
    return lines


def top_kernels(kernels: list[Span], lo: int, hi: int, n: int) -> list[str]:
    """The n kernel names with the most time inside [lo, hi), all devices together."""
    total: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for start, end, _, _, name in kernels:
        if end > lo and start < hi:
            total[name] += min(end, hi) - max(start, lo)
            count[name] += 1
    lines = []
    for name in sorted(total, key=total.__getitem__, reverse=True)[:n]:
        short = name if len(name) <= 70 else name[:67] + "..."
        lines.append(f"kernel {short}: {count[name]} calls, {total[name] / 1e6:.2f} ms "
                     f"({100 * total[name] / (hi - lo):.1f} % of the window), "
                     f"{total[name] / count[name] / 1e3:.1f} µs each")
    return lines


def steps(kernels: list[Span], copies: list[Copy], lo: int, hi: int, min_bytes: int) -> list[str]:
    """Per step, cut at the end of each device-to-host copy of at least min_bytes (a decode step's logits):
    the mean period, that copy's time, and per device the time with a kernel running and the time from the
    copy's end to the device's next kernel (the host's part between two steps: sampling, then issuing)."""
    big = sorted((c for c in copies if c[4] == "D2H" and c[5] >= min_bytes and lo <= c[1] <= hi), key=lambda c: c[1])
    if len(big) < 2:
        return [f"steps: fewer than two D2H copies of {min_bytes} bytes or more in the window"]
    ends = [c[1] for c in big]
    n = len(ends) - 1
    period = (ends[-1] - ends[0]) / n
    copy_ns = sum(c[1] - c[0] for c in big) / len(big)
    lines = [f"steps: {n} cut at D2H copies of >= {min_bytes} bytes: period {period / 1e6:.3f} ms "
             f"({spread_ms([b - a for a, b in pairwise(ends)])}), "
             f"the copy {copy_ns / 1e6:.3f} ms ({sum(c[5] for c in big) / len(big) / 2**20:.1f} MiB)"]
    for dev in sorted({k[2] for k in kernels}):
        spans = sorted((k[0], k[1]) for k in kernels if k[2] == dev)
        busy = union_ns(spans, ends[0], ends[-1]) / n
        starts = [s for s, _ in spans]  # ascending
        gaps = []
        for e in ends[:-1]:
            at = bisect.bisect_left(starts, e)  # the first kernel to start after the copy's end
            if at < len(starts):
                gaps.append(starts[at] - e)
        gap = sum(gaps) / len(gaps) if gaps else float("nan")
        lines.append(f"steps: GPU{dev}: kernels {busy / 1e6:.3f} ms a step ({100 * busy / period:.1f} %), "
                     f"copy end to the next kernel {gap / 1e6:.3f} ms ({spread_ms(gaps)})")
    return lines


def spread_ms(values_ns: list[int]) -> str:
    """p50 and p90 of durations in ns, as ms: where steps differ (a server's, some with a prompt piece)."""
    if not values_ns:
        return "p50 -, p90 -"
    v = sorted(values_ns)
    return f"p50 {v[len(v) // 2] / 1e6:.3f}, p90 {v[min(len(v) - 1, (9 * len(v)) // 10)] / 1e6:.3f}"


def write_window(src: Path, dst: Path, lo: int, hi: int) -> int:
    """Copy the records of a tools/cupti-trace CSV that overlap [lo, hi) (a trace small enough to keep)."""
    opener_in = gzip.open if src.suffix == ".gz" else open
    opener_out = gzip.open if dst.suffix == ".gz" else open
    n = 0
    with opener_in(src, "rt", newline="") as f, opener_out(dst, "wt", newline="") as g:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, fieldnames=reader.fieldnames or [])
        writer.writeheader()
        for row in reader:
            if int(row["end_ns"]) > lo and int(row["start_ns"]) < hi:
                writer.writerow(row)
                n += 1
    return n


def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", type=Path,
                    help="nsys export --type sqlite output, or a tools/cupti-trace CSV (.csv, .csv.gz)")
    ap.add_argument("-o", "--output", type=Path, help="PNG to write")
    ap.add_argument("--no-plot", action="store_true", help="print the summary only")
    ap.add_argument("--window-ms", type=float, default=40.0)
    ap.add_argument("--end-ms", type=float, default=None,
                    help="window end, ms after the first kernel, or before the last one when negative "
                         "(default: the last kernel)")
    ap.add_argument("--title", default="GPU timeline")
    ap.add_argument("--top-kernels", type=int, default=0, metavar="N",
                    help="also print the N kernels with the most time in the window")
    ap.add_argument("--steps-d2h", type=int, default=0, metavar="BYTES",
                    help="also print per-step means, steps cut at device-to-host copies of at least BYTES (logits)")
    ap.add_argument("--write-window", type=Path, metavar="CSV",
                    help="write the records of a tools/cupti-trace CSV that overlap the window to CSV (gzip if .gz)")
    args = ap.parse_args()
    if args.output is None and not args.no_plot:
        ap.error("-o PNG is needed (or --no-plot)")
    if not args.db.is_file():
        ap.error(f"{args.db}: no such file")

    kernels, copies, calls = load(args.db)
    if not kernels:
        print(f"so-timeline: no kernels in {args.db}", file=sys.stderr)
        return 1
    t0 = min(k[0] for k in kernels)
    t_last = max(k[1] for k in kernels)
    if args.end_ms is None:
        t_end = t_last
    else:
        t_end = int((t0 if args.end_ms >= 0 else t_last) + args.end_ms * 1e6)
    t_start = int(t_end - args.window_ms * 1e6)
    lines = summary(kernels, copies, calls, t_start, t_end)
    if args.top_kernels:
        lines += top_kernels(kernels, t_start, t_end, args.top_kernels)
    if args.steps_d2h:
        lines += steps(kernels, copies, t_start, t_end, args.steps_d2h)
    for line in lines:
        print(f"so-timeline: {line}")
    if args.write_window:
        if args.db.suffix not in (".csv", ".gz"):
            ap.error("--write-window needs a tools/cupti-trace CSV")
        n = write_window(args.db, args.write_window, t_start, t_end)
        print(f"so-timeline: {args.write_window} ({n} records of the window)")
    if args.no_plot:
        return 0
    try:
        import matplotlib
    except ImportError:
        print("so-timeline: needs matplotlib", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[tuple[int, int], list[tuple[float, float, bool]]] = defaultdict(list)
    for start, end, dev, stream, _ in kernels:
        if end > t_start and start < t_end:
            rows[(dev, stream)].append(((start - t_start) / 1e6, (end - start) / 1e6, False))
    for start, end, dev, stream, _, _ in copies:
        if end > t_start and start < t_end:
            rows[(dev, stream)].append(((start - t_start) / 1e6, (end - start) / 1e6, True))
    keys = sorted(rows)
    # host threads with calls in the window, below the streams: synchronizing calls in red
    host: dict[int, list[tuple[float, float, bool]]] = defaultdict(list)
    for start, end, thread, _, name in calls:
        if end > t_start and start < t_end:
            host[thread].append(((start - t_start) / 1e6, (end - start) / 1e6, "ynchronize" in name))
    fig, ax = plt.subplots(figsize=(11, 0.45 * (len(keys) + len(host)) + 1.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for y, key in enumerate(keys):
        colour = colours[y % len(colours)]
        spans = rows[key]
        ax.broken_barh([(s, w) for s, w, copy in spans if not copy], (y - 0.35, 0.7), color=colour)
        ax.broken_barh([(s, w) for s, w, copy in spans if copy], (y - 0.35, 0.7), facecolor="white",
                       edgecolor=colour, hatch="////")
    for y, thread in enumerate(sorted(host), start=len(keys)):
        spans = host[thread]
        ax.broken_barh([(s, w) for s, w, sync in spans if not sync], (y - 0.35, 0.7), color="0.6")
        ax.broken_barh([(s, w) for s, w, sync in spans if sync], (y - 0.35, 0.7), color="tab:red")
    labels = [f"GPU{d} stream {s}" for d, s in keys] + [f"host thread {t % 100000}" for t in sorted(host)]
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, args.window_ms)
    ax.set_xlabel("ms (solid: kernels, hatched: copies; host rows: CUDA calls, red: synchronizing)")
    ax.set_title(args.title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"so-timeline: {args.output} ({len(keys)} streams, {len(host)} host threads, {args.window_ms:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

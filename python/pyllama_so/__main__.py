"""`python -m pyllama_so [info|--version] [--rpc SERVERS]`: what this build is and which devices it sees."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pyllama_so
from pyllama_so import _llama, args as A


def _device_line(d: dict[str, Any]) -> str:
    mem = f", {int(d['memory_total']) / 2**30:.1f} GiB" if d["memory_total"] else ""
    return f"  {d['index']}: {d['name']} [{d['backend']}, {d['type']}] {d['description']}{mem}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so", description=__doc__)
    ap.add_argument("--version", action="store_true", help="print the version and the upstream commit")
    ap.add_argument("command", nargs="?", choices=["info"], default="info")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    A.add_rpc_argument(ap)
    args = ap.parse_args(argv)

    info = pyllama_so.build_info()
    if args.version:
        print(f"pyllama_so {info['version']} (llama.cpp {str(info['upstream_commit'])[:9]}, "
              f"from {info['upstream_sdist']})")
        return 0
    if args.rpc:
        try:
            info["rpc_devices"] = _llama.rpc_devices(args.rpc)
        except (pyllama_so.RPCConnectionError, pyllama_so.LlamaError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    print(f"pyllama_so {info['version']}")
    print(f"upstream:          llama.cpp {info['upstream_commit']} ({info['upstream_sdist']})")
    print(f"compiled backends: {', '.join(info['compiled_backends'])}")
    print("devices:")
    for d in info["devices"]:
        print(_device_line(d))
    if args.rpc:
        print("remote devices (RPC):")
        for d in info["rpc_devices"]:
            print(_device_line(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())

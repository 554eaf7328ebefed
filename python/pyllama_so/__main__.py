"""`python -m pyllama_so [info|--version]`: what this build is and which devices it sees."""

from __future__ import annotations

import argparse
import json
import sys

import pyllama_so


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so", description=__doc__)
    ap.add_argument("--version", action="store_true", help="print the version and the upstream commit")
    ap.add_argument("command", nargs="?", choices=["info"], default="info")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)

    info = pyllama_so.build_info()
    if args.version:
        print(f"pyllama_so {info['version']} (llama.cpp {str(info['upstream_commit'])[:9]}, "
              f"from {info['upstream_sdist']})")
        return 0
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    print(f"pyllama_so {info['version']}")
    print(f"upstream:          llama.cpp {info['upstream_commit']} ({info['upstream_sdist']})")
    print(f"compiled backends: {', '.join(info['compiled_backends'])}")
    print("devices:")
    for d in info["devices"]:
        mem = f", {d['memory_total'] / 2**30:.1f} GiB" if d["memory_total"] else ""
        print(f"  {d['index']}: {d['name']} [{d['backend']}, {d['type']}] {d['description']}{mem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

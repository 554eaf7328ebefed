"""Load a model after a chosen set of device queries, to bisect a crash at load time.

    python -X faulthandler scripts/probe-load MODEL devices|backends|none [NGL]
"""
from __future__ import annotations

import sys


def main() -> int:
    from pyllama_so import _llama  # inside main: importing this module loads no extension

    path, what = sys.argv[1], sys.argv[2]
    ngl = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if what == "devices":
        print(_llama.devices(), flush=True)
    elif what == "backends":
        print(_llama.backends(), flush=True)
    print(f"probe: loading after {what!r}", flush=True)
    m = _llama.Model.load(path, n_gpu_layers=ngl)
    print(f"probe: loaded ({m.n_params} params)", flush=True)
    m.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m pyllama_so.rpc_server`: llama.cpp's RPC server, which lends this machine's devices to a
`Llama(rpc_servers=["host:port"])` (or `--rpc host:port`) on another.

    python -m pyllama_so.rpc_server --port 50052                  # loopback only: for tests, or an SSH tunnel
    python -m pyllama_so.rpc_server --host 10.0.0.2 --port 50052  # reachable on that network: see the warning

The protocol has no authentication and no encryption: whoever can connect can run computations on
the devices and read and write their memory. Listen beyond the loopback interface only on a network
that you trust. The server serves one client at a time and runs until stopped (Ctrl-C, SIGTERM).
This process becomes upstream's ggml-rpc-server (exec): signals reach it directly.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from pyllama_so import _llama, args as A

DEFAULT_PORT = 50052  # upstream's
SERVER_NAME = "ggml-rpc-server"


def server_path() -> Path:
    """Upstream's ggml-rpc-server, installed next to the bindings; FileNotFoundError in a build without it."""
    exe = Path(_llama.__file__).with_name(SERVER_NAME)
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: this build has no RPC server (built with -DGGML_RPC=OFF)")
    return exe


def ipv4_address(text: str) -> str:
    """--host: an IPv4 address, as the server binds with inet_addr (0.0.0.0: every interface)."""
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an IPv4 address such as 127.0.0.1 or 0.0.0.0, got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.rpc_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-H", "--host", type=ipv4_address, default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("-p", "--port", type=A.tcp_port(1), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("-d", "--device", type=A.comma_list(str), metavar="DEV[,DEV...]",
                    help="devices to lend, by name as `python -m pyllama_so info` lists them (default: every "
                         "GPU, or the CPU when there is none)")
    ap.add_argument("-t", "--threads", type=A.positive_int,
                    help="threads of the CPU device (default: half the hardware threads)")
    ap.add_argument("-c", "--cache", action="store_true",
                    help="keep received weights in a local cache ($LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc), "
                         "so that loading the same model again sends only their hashes")
    return ap


def command(ns: argparse.Namespace) -> list[str]:
    """The ggml-rpc-server command line for these arguments."""
    cmd = [str(server_path()), "--host", ns.host, "--port", str(ns.port)]
    if ns.device:
        cmd += ["--device", ",".join(ns.device)]
    if ns.threads:
        cmd += ["--threads", str(ns.threads)]
    if ns.cache:
        cmd.append("--cache")
    return cmd


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        cmd = command(ns)
    except FileNotFoundError as e:
        print(f"rpc_server: {e}", file=sys.stderr)
        return 1
    if not ipaddress.IPv4Address(ns.host).is_loopback:
        print(f"rpc_server: WARNING: listening on {ns.host}:{ns.port}, reachable from other machines. The RPC "
              "protocol has no authentication and no encryption: anyone who can connect can run computations "
              "on this machine's devices and read or write their memory. Use it only on a network you trust.",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores SIGPIPE and exec keeps that: a client that vanishes mid-reply is a failed send
    # for the server, not its end.
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())

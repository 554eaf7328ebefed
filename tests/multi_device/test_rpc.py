"""llama.cpp's RPC backend on loopback: two `python -m pyllama_so.rpc_server` processes (CPU backend) lend
their devices to models in this process; layer and tensor split over them equal the CPU alone; an
unreachable server and a server that goes away are RPCConnectionError, never an abort or a hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from pyllama_so import Llama, RPCConnectionError, _llama, rpc_server
from pyllama_so.archs import nmse
from pyllama_so.bench.__main__ import main as bench_main

pytestmark = pytest.mark.skipif(not _llama.rpc_supported(), reason="built without the RPC backend (-DGGML_RPC=OFF)")

TOKENS = list(range(1, 48))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `python -m pyllama_so.rpc_server` on loopback, lending the CPU with one thread."""

    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log_dir / f"rpc-server-{self.port}.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pyllama_so.rpc_server", "--port", str(self.port), "--device", "CPU",
                 "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300  # a hang guard: the server is ready when it answers the probe
        while True:
            try:
                _llama.probe_rpc_server(self.endpoint, timeout=1.0)
                return
            except RPCConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    output = self.log.read_text()
                    raise RuntimeError(f"rpc_server on port {self.port} did not start:\n{output}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    log_dir = tmp_path_factory.mktemp("rpc")
    started: list[Server] = []
    try:
        for _ in range(2):
            started.append(Server(log_dir))
        yield [s.endpoint for s in started]
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def cpu_logits(tiny_model: Path) -> np.ndarray:
    with Llama(tiny_model, n_ctx=256) as llm:
        return llm.eval(TOKENS)


def test_layer_split_over_the_cpu_and_two_servers_equals_the_cpu(tiny_model: Path, servers: list[str],
                                                                cpu_logits: np.ndarray,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    pyllama_so.set_log_level("info")
    try:
        # 2 of the tiny model's 3 offloadable layers: layer 0 on the CPU, layer 1 on one server, the output
        # layer on the other
        with Llama(tiny_model, n_ctx=256, n_gpu_layers=2, tensor_split=[1, 1], rpc_servers=servers) as llm:
            log = capfd.readouterr().err
            logits = llm.eval(TOKENS[:-1])
            step = llm.eval(TOKENS[-1:])  # a single-token decode on top of the cache
    finally:
        pyllama_so.set_log_level(None)
    for endpoint in servers:  # each server holds weights (of its device 0)
        assert f"RPC0[{endpoint}] model buffer size" in log
    assert "CPU_Mapped model buffer size" in log
    assert nmse(cpu_logits[:-1], logits) < 1e-4
    assert nmse(cpu_logits[-1:], step) < 1e-4


def test_tensor_split_over_two_servers_equals_the_cpu(tiny_model: Path, servers: list[str],
                                                      cpu_logits: np.ndarray) -> None:
    # supported: the Meta backend's generic AllReduce passes the partial results through this process
    with Llama(tiny_model, n_ctx=256, split_mode="tensor", rpc_servers=",".join(servers)) as llm:
        logits = llm.eval(TOKENS)
    assert nmse(cpu_logits, logits) < 1e-4


def test_servers_devices_are_listed_and_stay_out_of_the_local_ones(servers: list[str]) -> None:
    devs = _llama.rpc_devices(servers)
    assert [d["description"] for d in devs] == servers
    assert all(d["backend"] == "RPC" and d["name"].startswith("RPC") and d["memory_total"] > 0 for d in devs)
    assert [d["index"] for d in devs] == [len(_llama.devices()) + i for i in range(2)]
    assert not any(d["backend"] == "RPC" for d in _llama.devices())  # not registered for every later model
    out = subprocess.run([sys.executable, "-m", "pyllama_so", "info", "--json", "--rpc", ",".join(servers)],
                         check=True, capture_output=True, text=True).stdout
    info = json.loads(out)
    assert "RPC" in info["compiled_backends"]
    assert [d["description"] for d in info["rpc_devices"]] == servers
    text = subprocess.run([sys.executable, "-m", "pyllama_so", "info"], check=True, capture_output=True, text=True,
                          env={**os.environ, "LLAMA_ARG_RPC": servers[0]}).stdout
    assert "remote devices (RPC):" in text and servers[0] in text


def test_tensor_split_and_main_gpu_count_the_servers_devices(tiny_model: Path, servers: list[str]) -> None:
    n = len(servers) + _llama.gpu_device_count()  # the servers' devices, then the local GPUs
    with pytest.raises(ValueError, match=f"{n + 1} entries but there are {n} device"):
        Llama(tiny_model, n_ctx=256, tensor_split=[1] * (n + 1), rpc_servers=servers)
    with pytest.raises(ValueError, match=f"main_gpu {n} out of range"):
        Llama(tiny_model, n_ctx=256, split_mode="none", main_gpu=n, rpc_servers=servers)
    with Llama(tiny_model, n_ctx=256, split_mode="none", main_gpu=1, rpc_servers=servers) as llm:
        llm.eval(TOKENS[:4])


def test_an_unreachable_server_is_a_connection_error_before_loading(tiny_model: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(RPCConnectionError, match=f"RPC server {endpoint}: connection refused") as err:
        Llama(tiny_model, n_ctx=256, rpc_servers=[endpoint])
    assert isinstance(err.value, ConnectionError) and err.value.endpoint == endpoint
    res = subprocess.run([sys.executable, "-m", "pyllama_so", "info", "--rpc", endpoint], capture_output=True,
                         text=True)
    assert res.returncode == 1 and f"RPC server {endpoint}: connection refused" in res.stderr


def test_a_listener_that_does_not_answer_is_a_timeout_not_a_hang() -> None:
    # connections wait in the backlog of a socket that never accepts: as a server busy with another client
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        # the message names the probe's own timeout: it gave up on it, not on a connection error
        with pytest.raises(RPCConnectionError, match="no HELLO reply within 0.3 s"):
            _llama.probe_rpc_server(endpoint, timeout=0.3)


@pytest.mark.parametrize("bad", ["localhost", "host:0", "host:65536", ":50052", "host:port", "a:b:1", "h:1,,h:2",
                                 "h:1,h:1", ""])
def test_bad_server_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        _llama.rpc_endpoints(bad)


def test_server_addresses() -> None:
    assert _llama.rpc_endpoints(" 10.0.0.2:50052, gpu-box:7 ") == ["10.0.0.2:50052", "gpu-box:7"]
    assert _llama.rpc_endpoints(["h:01"]) == ["h:1"]
    with pytest.raises(TypeError):
        _llama.rpc_endpoints(50052)


def test_bench_runs_on_the_servers(tiny_model: Path, servers: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # -ts counts the servers' devices (more entries than local devices)
    argv = ["-m", str(tiny_model), "--rpc", ",".join(servers), "-ts", "1/3", "-p", "16", "-n", "2", "-r", "1",
            "--no-progress"]
    assert bench_main(argv + ["-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["backends"].split(",")[-1] for r in rows] == ["RPC", "RPC"]
    assert all(r["rpc_servers"] == servers and r["tensor_split"] == "1.00/3.00" and r["avg_ts"] > 0 for r in rows)
    assert bench_main(argv + ["-o", "md"]) == 0
    md = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in md[0].strip("|").split("|")]
    backend = header.index("backend")
    assert all(line.strip("|").split("|")[backend].strip().endswith("RPC") for line in md[2:])


def test_bench_names_an_unreachable_server(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    assert bench_main(["-m", str(tiny_model), "--rpc", endpoint, "-p", "16", "-n", "0", "--no-progress"]) == 1
    assert f"RPC server {endpoint}: connection refused" in capsys.readouterr().err


def test_the_openai_server_runs_on_the_servers(tiny_model: Path, servers: list[str]) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    with Llama(tiny_model, n_ctx=256) as llm:
        expected = llm.create_completion("Hello", max_tokens=8, temperature=0.0)["choices"][0]["text"]
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_so.server", "-m", str(tiny_model), "--port", "0",
                             "-c", "256", "-np", "1", "--rpc", ",".join(servers)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:  # the server logs its address once it listens
            if "listening on http://" in line:
                url = line.split("listening on ")[1].strip()
                break
        assert url, "the server exited before listening"
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "temperature": 0},
                           timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == expected
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    endpoint = f"127.0.0.1:{free_port()}"
    res = subprocess.run([sys.executable, "-m", "pyllama_so.server", "-m", str(tiny_model), "--rpc", endpoint],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and f"RPC server {endpoint}: connection refused" in res.stderr


# A server that goes away: the process must survive (RPCConnectionError, never SIGABRT), in a subprocess so
# that a regression cannot take pytest down. The script reads the server's endpoint, then waits for "go".
LOST_SERVER = textwrap.dedent("""
    import sys, time
    from pyllama_so import Llama, RPCConnectionError
    model, endpoint, mode = sys.argv[1:4]
    tokens = list(range(1, 48))
    llm = Llama(model, n_ctx=256, rpc_servers=[endpoint])
    llm.eval(tokens[:8])
    print("ready", flush=True)
    errors = 0
    if mode == "between":
        sys.stdin.readline()  # the server was killed
        for _ in range(2):  # the next decode, and every later one
            try:
                llm.eval(tokens[8:9])
            except RPCConnectionError as e:
                errors += 1
                print(f"error: {e}", flush=True)
    else:  # decodes until one fails; the server is killed while they run
        deadline, decoding = time.monotonic() + 300, False  # a hang guard: the kill ends the loop
        while not errors and time.monotonic() < deadline:
            try:
                llm.reset()
                llm.eval(tokens)
                if not decoding:
                    print("decoding", flush=True)  # the test kills the server now: decodes go on meanwhile
                    decoding = True
            except RPCConnectionError as e:
                errors += 1
                print(f"error: {e}", flush=True)
    llm.close()
    with Llama(model, n_ctx=256) as local:  # the process goes on
        local.eval(tokens[:4])
    print(f"errors={errors} closed", flush=True)
""")


@pytest.mark.parametrize("mode", ["between", "during"])
def test_a_server_that_goes_away_is_a_connection_error(tiny_model: Path, tmp_path: Path, mode: str) -> None:
    server = Server(tmp_path)
    try:
        proc = subprocess.Popen([sys.executable, "-c", LOST_SERVER, str(tiny_model), server.endpoint, mode],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            if mode == "during":
                assert proc.stdout.readline().strip() == "decoding"
            server.kill()
            out, err = proc.communicate("go\n", timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        server.stop()
    assert proc.returncode == 0, f"rc={proc.returncode} (-{int(signal.SIGABRT)} is the upstream abort)\n{err}"
    assert f"error: RPC server {server.endpoint}: decode: the connection was lost" in out
    assert out.strip().endswith(f"errors={2 if mode == 'between' else 1} closed")
    assert f"lost the connection to RPC server {server.endpoint}" in err  # llama.cpp's log says it too


def test_a_restarted_server_is_used_again_by_a_new_model(tiny_model: Path, tmp_path: Path,
                                                        cpu_logits: np.ndarray) -> None:
    server = Server(tmp_path)
    try:
        llm = Llama(tiny_model, n_ctx=256, rpc_servers=[server.endpoint])
        llm.eval(TOKENS[:4])
        server.kill()
        with pytest.raises(RPCConnectionError, match="the connection was lost"):
            llm.eval(TOKENS[4:5])
        with pytest.raises(RPCConnectionError, match="lost earlier"):  # while a model still uses it
            Llama(tiny_model, n_ctx=256, rpc_servers=[server.endpoint])
        llm.close()
        server = Server(tmp_path, server.port)
        with Llama(tiny_model, n_ctx=256, rpc_servers=[server.endpoint]) as again:
            assert nmse(cpu_logits, again.eval(TOKENS)) < 1e-4
    finally:
        server.stop()


def test_the_server_ships_in_the_package() -> None:
    exe = rpc_server.server_path()
    assert exe.parent == Path(_llama.__file__).parent and os.access(exe, os.X_OK)


def test_rpc_server_warns_beyond_loopback_and_checks_its_arguments() -> None:
    cmd = [sys.executable, "-m", "pyllama_so.rpc_server"]
    # an unknown device stops the server before it listens, after the warning
    res = subprocess.run(cmd + ["--host", "0.0.0.0", "--port", str(free_port()), "--device", "NO_SUCH_DEVICE"],
                         capture_output=True, text=True, timeout=60)
    assert "WARNING: listening on 0.0.0.0" in res.stderr and "no authentication" in res.stderr
    assert res.returncode != 0 and "unknown device: NO_SUCH_DEVICE" in res.stderr
    quiet = subprocess.run(cmd + ["--port", str(free_port()), "--device", "NO_SUCH_DEVICE"], capture_output=True,
                           text=True, timeout=60)
    assert "WARNING" not in quiet.stderr and quiet.returncode != 0
    for bad in (["--host", "localhost"], ["--port", "70000"], ["--threads", "0"]):
        res = subprocess.run(cmd + bad, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, bad

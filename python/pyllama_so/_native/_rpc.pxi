# llama.cpp's RPC backend (ggml-rpc): the devices of ggml-rpc-server processes, on this machine or others,
# handed to a model through llama_model_params.devices (docs/multi-gpu.md, "More than one machine").
# Included by _llama.pyx. Nothing here links against ggml-rpc: its functions are looked up by name through
# the RPC backend registry, as upstream's --rpc does, so a build without it says so instead of failing to load.
#
# The servers are not registered with ggml (ggml_backend_register), unlike upstream's --rpc: a registered
# server would join the default devices of every later model in the process, and every device query
# would connect to it. A model that asks for servers gets their devices explicitly instead.

from libcpp.vector cimport vector
import socket
import struct

# by name from the RPC registry: upstream's, and ours from patches/0008-*
ctypedef ggml_backend_reg_t (*_rpc_add_server_t)(const char * endpoint) noexcept nogil
ctypedef int (*_rpc_connection_state_t)(const char * endpoint) noexcept nogil

# ggml_backend_rpc_connection_state (patches/0008-*)
cdef enum:
    _RPC_NOT_CONNECTED = 0
    _RPC_CONNECTED = 1
    _RPC_LOST = 2

RPC_CONNECT_TIMEOUT_S = 5.0  # for the connection and the server's HELLO reply

# The client's first message (ggml-rpc.cpp): command RPC_CMD_HELLO (14, fixed across protocol versions),
# its size, and the connection capabilities (RPC_CONN_CAPS_SIZE bytes, transport.h; zero: plain TCP).
# The reply: its size, then major, minor, patch, one padding byte and the server's capabilities.
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_RPC_HELLO_REPLY = struct.Struct("<QBBBx24s")


class RPCConnectionError(ConnectionError):
    """An RPC server cannot be reached, does not answer as one, or went away while in use.
    endpoint is the server's "host:port"."""

    def __init__(self, endpoint, reason):
        super().__init__(f"RPC server {endpoint}: {reason}")
        self.endpoint = endpoint


def rpc_supported():
    """Whether this build has llama.cpp's RPC backend (on unless built with -DGGML_RPC=OFF)."""
    return ggml_backend_reg_by_name("RPC") != NULL


cdef void * _rpc_proc(const char * name) except NULL:
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC")
    if reg == NULL:
        raise LlamaError("this build has no RPC backend (it was built with -DGGML_RPC=OFF)")
    cdef void * fn = ggml_backend_reg_get_proc_address(reg, name)
    if fn == NULL:
        raise LlamaError(f"the RPC backend has no {name.decode()}")
    return fn


def rpc_endpoints(servers):
    """RPC servers as a list of "host:port" strings: a comma-separated string (llama.cpp's --rpc) or a
    sequence of strings. ValueError for an entry that is not host:port with a port in 1..65535, or one
    given twice. The host is an IPv4 address or a name: the RPC backend connects over IPv4."""
    if isinstance(servers, str):
        items = [s.strip() for s in servers.split(",")]
    else:
        try:
            items = list(servers)
        except TypeError:
            raise TypeError(f"rpc_servers must be a string or a sequence of strings, not "
                            f"{type(servers).__name__}") from None
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"an RPC server must be a 'host:port' string, not {type(item).__name__}")
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or ":" in host or any(c.isspace() for c in host) or not port.isdigit() \
                or not 0 < int(port) < 65536:
            raise ValueError(f"bad RPC server {item!r}: expected host:port (IPv4 address or name, port 1-65535)")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise ValueError(f"RPC server {endpoint} is listed twice")
        out.append(endpoint)
    if not out:
        raise ValueError("no RPC servers given")
    return out


def _recv_exactly(sock, size_t n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def probe_rpc_server(str endpoint, double timeout=RPC_CONNECT_TIMEOUT_S):
    """Connect to an RPC server and exchange its HELLO, within timeout seconds each. Returns the server's
    protocol version (major, minor, patch); RPCConnectionError names the server and what went wrong.

    The RPC backend aborts the process when it cannot connect and waits without limit for a reply; this
    check runs before it connects. A server serves one client at a time: one that is busy with another
    client does not answer the HELLO (a connection of this process is reused, not probed)."""
    host, _, port = endpoint.rpartition(":")
    try:
        addr = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4]
    except socket.gaierror as e:
        raise RPCConnectionError(endpoint, f"cannot resolve {host!r} to an IPv4 address ({e.strerror})") from None
    hello = struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    connected = False
    try:
        sock.connect(addr)
        connected = True
        sock.sendall(hello)
        reply = _recv_exactly(sock, _RPC_HELLO_REPLY.size)
    except ConnectionRefusedError:
        reason = "connection refused (no ggml-rpc-server listening there)"
    except socket.timeout:
        reason = (f"no HELLO reply within {timeout:g} s: not a ggml-rpc-server, or one busy with another "
                  "client (it serves one at a time)") if connected else f"no connection within {timeout:g} s"
    except OSError as e:
        reason = (e.strerror or str(e)) + (" during the HELLO exchange: not a ggml-rpc-server?" if connected else "")
    else:
        reason = None
    finally:
        sock.close()
    if reason is not None:
        raise RPCConnectionError(endpoint, reason)
    size, major, minor, patch, _ = _RPC_HELLO_REPLY.unpack(reply)
    if size != _RPC_HELLO_REPLY.size - 8:
        raise RPCConnectionError(endpoint, "unexpected HELLO reply: not a ggml-rpc-server?")
    # the RPC backend's own rule (negotiate_hello)
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise RPCConnectionError(endpoint, f"protocol version {major}.{minor}.{patch}, this build speaks "
                                 f"{RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}.x: use the same "
                                 "llama.cpp version on both sides")
    return major, minor, patch


cdef int _rpc_connection_state(str endpoint) except -1:
    cdef _rpc_connection_state_t state = <_rpc_connection_state_t> _rpc_proc(b"ggml_backend_rpc_connection_state")
    cdef bytes b = endpoint.encode()
    return state(b)


cdef _check_rpc_servers(tuple endpoints, str what):
    """RPCConnectionError when the connection to one of these servers broke: the RPC backend then stops
    sending and fails graph computations (patches/0008-*), and what ran since is not to be trusted."""
    for endpoint in endpoints:
        if _rpc_connection_state(endpoint) == _RPC_LOST:
            raise RPCConnectionError(endpoint, f"{what}: the connection was lost (the server stopped or the "
                                     "network failed); close this model and load it again")


cdef _rpc_connect(list endpoints, vector[ggml_backend_dev_t] & out):
    """Append the devices of each server, in the order given; probe the ones this process has no
    connection to first, so that an unreachable one is an exception, not an abort."""
    cdef _rpc_add_server_t add_server = <_rpc_add_server_t> _rpc_proc(b"ggml_backend_rpc_add_server")
    cdef ggml_backend_reg_t reg
    cdef bytes b
    cdef const char * c_endpoint
    cdef size_t i
    for endpoint in endpoints:
        state = _rpc_connection_state(endpoint)
        if state == _RPC_LOST:
            raise RPCConnectionError(endpoint, "the connection was lost earlier: close the models that use it")
        if state == _RPC_NOT_CONNECTED:
            probe_rpc_server(endpoint)
        b = endpoint.encode()
        c_endpoint = b
        with nogil:  # connects: the device count
            reg = add_server(c_endpoint)
        if reg == NULL:
            raise RPCConnectionError(endpoint, "the server has no devices")
        for i in range(ggml_backend_reg_dev_count(reg)):
            out.push_back(ggml_backend_reg_dev_get(reg, i))


cdef vector[ggml_backend_dev_t] _rpc_model_devices(list endpoints, str split_mode) except *:
    """The devices of a model that uses RPC servers: the servers' devices first (upstream's order: the
    last layers and the output stay local, so fewer activations cross the network), then the local
    devices llama.cpp picks by itself: under split_mode "tensor" every device that does not compute in
    CPU memory, otherwise the GPUs (integrated ones only when there is no other)."""
    cdef vector[ggml_backend_dev_t] out
    _rpc_connect(endpoints, out)
    cdef size_t i
    cdef ggml_backend_dev_t dev
    cdef vector[ggml_backend_dev_t] igpus
    cdef bint any_gpu = False
    for i in range(ggml_backend_dev_count()):
        dev = ggml_backend_dev_get(i)
        if split_mode == "tensor":
            if ggml_backend_dev_buffer_type(dev) != ggml_backend_cpu_buffer_type():
                out.push_back(dev)
        elif ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU:
            out.push_back(dev)
            any_gpu = True
        elif ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_IGPU:
            igpus.push_back(dev)
    if not any_gpu and split_mode != "tensor":
        out.insert(out.end(), igpus.begin(), igpus.end())
    return out


def rpc_devices(servers):
    """The devices of these RPC servers (a list or a comma-separated string of host:port), as devices()
    describes local ones; their index continues after the local devices'. RPCConnectionError for a
    server that cannot be reached."""
    cdef vector[ggml_backend_dev_t] devs
    _rpc_connect(rpc_endpoints(servers), devs)
    cdef size_t n_local = ggml_backend_dev_count()
    return [_device_info(n_local + i, devs[i]) for i in range(devs.size())]

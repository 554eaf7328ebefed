# Backends and devices: what llama.cpp sees, and the CPU virtual devices. Included by _llama.pyx.

def upstream_version():
    """llama.cpp's own version string."""
    return (<bytes> llama_version()).decode()


def system_info():
    return (<bytes> llama_print_system_info()).decode()


def max_devices():
    return llama_max_devices()


def supports_gpu_offload():
    return llama_supports_gpu_offload()


_DEV_TYPES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
              GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
              GGML_BACKEND_DEVICE_TYPE_META: "meta"}


cdef dict _device_info(size_t index, ggml_backend_dev_t dev):
    cdef size_t free_mem, total_mem
    ggml_backend_dev_memory(dev, &free_mem, &total_mem)
    return {
        "index": index,
        "name": (<bytes> ggml_backend_dev_name(dev)).decode(),
        "description": (<bytes> ggml_backend_dev_description(dev)).decode(),
        "type": _DEV_TYPES.get(ggml_backend_dev_type(dev), "unknown"),
        "backend": (<bytes> ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev))).decode(),
        "memory_free": free_mem,
        "memory_total": total_mem,
    }


def devices():
    """Every ggml backend device: index, name, description, type, backend, memory (RPC servers' devices
    are not among them: rpc_devices() lists those)."""
    cdef size_t i
    return [_device_info(i, ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]


def backends():
    """Names of the registered backends that have at least one device."""
    cdef size_t i
    cdef ggml_backend_reg_t reg
    out = []
    for i in range(ggml_backend_reg_count()):
        reg = ggml_backend_reg_get(i)
        if ggml_backend_reg_dev_count(reg) > 0:
            out.append((<bytes> ggml_backend_reg_name(reg)).decode())
    return out


def gpu_device_count():
    """GPU devices (integrated ones included) that llama.cpp sees."""
    return sum(1 for d in devices() if d["type"] in ("gpu", "igpu"))


def cpu_virtual_devices(int n):
    """Make n CPU virtual devices (named CPUV0.., at most 16) if none exist yet; return how many exist.

    They let llama.cpp's tensor split run without a GPU. GGML_CPU_VIRTUAL_DEVICES=N creates them at
    start-up instead. See ggml/include/ggml-cpu-virtual.h.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    return ggml_backend_cpu_virtual_init(n)

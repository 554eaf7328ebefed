# The rules for parameter values: the one place that checks them (Llama, the argument parser and
# the bench call these). Included by _llama.pyx.

SPLIT_MODES = {"none": LLAMA_SPLIT_MODE_NONE, "layer": LLAMA_SPLIT_MODE_LAYER,
               "row": LLAMA_SPLIT_MODE_ROW, "tensor": LLAMA_SPLIT_MODE_TENSOR}
FLASH_ATTN = {"auto": LLAMA_FLASH_ATTN_TYPE_AUTO, "off": LLAMA_FLASH_ATTN_TYPE_DISABLED,
              "on": LLAMA_FLASH_ATTN_TYPE_ENABLED}
CACHE_TYPES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "bf16": GGML_TYPE_BF16, "q8_0": GGML_TYPE_Q8_0,
               "q4_0": GGML_TYPE_Q4_0, "q4_1": GGML_TYPE_Q4_1, "q5_0": GGML_TYPE_Q5_0, "q5_1": GGML_TYPE_Q5_1}

_FLASH_ATTN_ALIASES = {"0": "off", "false": "off", "disabled": "off", "1": "on", "true": "on", "enabled": "on"}


def split_mode_name(value):
    """A split mode as its name: a name ("none", "layer", "row", "tensor") or llama.cpp's enum value."""
    names = list(SPLIT_MODES)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"split_mode must be a name or an int, not {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value < len(names):
            raise ValueError(f"unknown split_mode {value}; expected 0..{len(names) - 1} or one of {names}")
        return names[value]
    if value.lower() not in SPLIT_MODES:
        raise ValueError(f"unknown split_mode {value!r}; expected one of {names}")
    return value.lower()


def flash_attn_name(value):
    """Flash attention as "auto", "on" or "off": a bool, None (auto), or a name or 0/1."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        key = _FLASH_ATTN_ALIASES.get(value.lower(), value.lower())
        if key in FLASH_ATTN:
            return key
    raise ValueError(f"unknown flash_attn {value!r}; expected a bool or one of {list(FLASH_ATTN) + list(_FLASH_ATTN_ALIASES)}")


def cache_type_name(value, str what="cache type"):
    """A KV-cache type as its ggml name ("f16", "q8_0", ...): a name or a ggml_type id."""
    if isinstance(value, int) and not isinstance(value, bool):
        name = (<bytes> ggml_type_name(<ggml_type> value)).decode() if 0 <= value < GGML_TYPE_COUNT else ""
        if name not in CACHE_TYPES:
            raise ValueError(f"unsupported {what}: ggml type id {value}" + (f" ({name})" if name else ""))
        return name
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a ggml type name or id, not {type(value).__name__}")
    if value.lower() not in CACHE_TYPES:
        raise ValueError(f"unknown {what} {value!r}; expected one of {list(CACHE_TYPES)}")
    return value.lower()


def _check_split(what, split, n_devices):
    try:
        values = [float(v) for v in split]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of numbers, got {split!r}") from None
    if not values:
        raise ValueError(f"{what} is empty")
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{what} entries must be finite and >= 0: {values}")
    if not any(values):
        raise ValueError(f"{what} entries are all 0: {values}")
    limit = min(llama_max_devices(), max(1, gpu_device_count()) if n_devices is None else n_devices)
    if len(values) > limit:
        raise ValueError(f"{what} has {len(values)} entries but there are {limit} device(s)")
    return values


def check_tensor_split(tensor_split, n_devices=None):
    """tensor_split as a list of floats: finite, >= 0, not all 0, at most n_devices entries (default:
    the GPU devices there are, or 1 without GPUs; never more than llama.cpp's maximum)."""
    return _check_split("tensor_split", tensor_split, n_devices)


def check_attn_split(attn_split, n_devices=None):
    """attn_split (the attention heads' and KV cache's proportions per device under split_mode="tensor")
    as a list of floats, with the rules of check_tensor_split: finite, >= 0, not all 0 (a 0 entry gives that
    device no attention), at most n_devices entries."""
    return _check_split("attn_split", attn_split, n_devices)


def check_batch_sizes(n_batch, n_ubatch):
    """n_batch and n_ubatch: both >= 1, and n_ubatch <= n_batch."""
    if n_batch < 1 or n_ubatch < 1:
        raise ValueError(f"n_batch and n_ubatch must be >= 1, got {n_batch} and {n_ubatch}")
    if n_ubatch > n_batch:
        raise ValueError(f"n_ubatch ({n_ubatch}) must not exceed n_batch ({n_batch})")


def default_n_ubatch(n_batch, split_overlap):
    """The ubatch when none is given: llama.cpp's 512, or half of n_batch with split overlap, so that
    each batch gives both lanes a ubatch (on two H200s, pp2048 with -b 2048 ran fastest at -ub 1024 of
    128-2048; docs/benchmarks.md). Never below the 64 tokens a lane needs, nor above n_batch."""
    if split_overlap:
        return min(n_batch, max(64, n_batch // 2))
    return min(n_batch, 512)

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
    raise ValueError(f"unknown flash_attn {value!r}; expected a bool or one of "
                     f"{list(FLASH_ATTN) + list(_FLASH_ATTN_ALIASES)}")


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


class TensorSplitOnlyError(ValueError):
    """A parameter of split_mode="tensor" only (attn_split, split_overlap, allreduce) given with another split mode.
    param names it; split_mode is the mode given. The bench skips such combinations of its lists."""

    def __init__(self, param, split_mode, why):
        super().__init__(f'{param} needs split_mode="tensor" (got split_mode={split_mode!r}): {why}')
        self.param = param
        self.split_mode = split_mode


# why each parameter of tensor split only needs it (the second half of TensorSplitOnlyError's message)
_TENSOR_SPLIT_ONLY = {
    "attn_split": "it splits the attention heads of tensor split",
    "split_overlap": "the two lanes overlap the AllReduces of tensor split",
    "allreduce": "only tensor split reduces partial results across the devices",
}


def check_tensor_split_only(param, split_mode):
    """TensorSplitOnlyError unless split_mode is "tensor": for attn_split, split_overlap and allreduce, whose value
    means nothing with another split mode (checked before attn_split's length: no device count makes it right)."""
    mode = split_mode_name(split_mode)
    if mode != "tensor":
        raise TensorSplitOnlyError(param, mode, _TENSOR_SPLIT_ONLY[param])


def check_main_gpu(main_gpu, n_devices):
    """main_gpu indexes one of the n_devices a model may use (the GPUs; with RPC servers theirs first)."""
    if not 0 <= main_gpu < n_devices:
        raise ValueError(f"main_gpu {main_gpu} out of range: {n_devices} device(s)")


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


# llama.cpp's pooling types for embeddings; "unspecified" (None) keeps the model's own
POOLING_TYPES = {"unspecified": LLAMA_POOLING_TYPE_UNSPECIFIED, "none": LLAMA_POOLING_TYPE_NONE,
                 "mean": LLAMA_POOLING_TYPE_MEAN, "cls": LLAMA_POOLING_TYPE_CLS, "last": LLAMA_POOLING_TYPE_LAST,
                 "rank": LLAMA_POOLING_TYPE_RANK}
_POOLING_NAMES = {v: k for k, v in POOLING_TYPES.items()}


def pooling_type_name(value):
    """A pooling type as its name: a name ("none", "mean", "cls", "last", "rank", "unspecified"), None
    ("unspecified": the model's default) or llama.cpp's enum value (-1..4, llama-cpp-python's constants)."""
    if value is None:
        return "unspecified"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"pooling_type must be a name or an int, not {type(value).__name__}")
    if isinstance(value, int):
        if value not in _POOLING_NAMES:
            raise ValueError(f"unknown pooling_type {value}; expected -1..4 or one of {list(POOLING_TYPES)}")
        return _POOLING_NAMES[value]
    if value.lower() not in POOLING_TYPES:
        raise ValueError(f"unknown pooling_type {value!r}; expected one of {list(POOLING_TYPES)}")
    return value.lower()


# llama_model_kv_override's key and string value are char[128], NUL included
KV_OVERRIDE_MAX_BYTES = 127


def check_kv_overrides(kv_overrides):
    """kv_overrides (GGUF metadata key -> bool, int, float or str, as llama-cpp-python's) as a list of
    (key, kind, value) with kind one of "bool", "int", "float", "str". Keys and strings are at most 127
    UTF-8 bytes; ints fit int64."""
    if not isinstance(kv_overrides, dict):
        raise TypeError(f"kv_overrides must be a dict of str to bool/int/float/str, not {type(kv_overrides).__name__}")
    out = []
    for key, value in kv_overrides.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"kv_overrides: keys must be non-empty strings, got {key!r}")
        if len(key.encode()) > KV_OVERRIDE_MAX_BYTES:
            raise ValueError(f"kv_overrides: key {key!r} is longer than {KV_OVERRIDE_MAX_BYTES} bytes")
        if isinstance(value, bool):
            kind = "bool"
        elif isinstance(value, int):
            if not -2**63 <= value < 2**63:
                raise ValueError(f"kv_overrides[{key!r}]: {value} does not fit a 64-bit integer")
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        elif isinstance(value, str):
            if len(value.encode()) > KV_OVERRIDE_MAX_BYTES:
                raise ValueError(f"kv_overrides[{key!r}]: the string is longer than {KV_OVERRIDE_MAX_BYTES} bytes")
            kind = "str"
        else:
            raise ValueError(f"kv_overrides[{key!r}]: unsupported value type {type(value).__name__} "
                             "(expected bool, int, float or str)")
        out.append((key, kind, value))
    return out

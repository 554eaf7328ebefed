"""pyllama_so.config: the model and context parameters of every entry point, checked once. Each rule raises
one error naming its parameter, and Llama, the server, the bench and the perplexity tool refuse the same bad
input with the same message."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from helpers.split_devices import virtual_devices
from pyllama_so import Llama, _llama, allreduce, config
from pyllama_so.bench.__main__ import main as bench_main
from pyllama_so.config import ContextParams, ModelParams, ParamError, TensorSplitOnlyError
from pyllama_so.perplexity.__main__ import main as perplexity_main
from pyllama_so.server.__main__ import main as server_main

MAKES_CPU_VIRTUAL_DEVICES = True  # the main_gpu rule needs devices: this module runs last (conftest)


def n_devices() -> int:
    """The devices a split may name (the GPUs, CPU virtual devices included; at least 1)."""
    return max(1, _llama.gpu_device_count())


# -- each rule: one error, naming its parameter ---------------------------------------------------------

MODEL_RULES: list[tuple[dict[str, Any], str, str]] = [  # kwargs, parameter, a piece of the message
    ({"split_mode": "diagonal"}, "split_mode", "unknown split_mode 'diagonal'"),
    ({"split_mode": 7}, "split_mode", "unknown split_mode 7"),
    ({"tensor_split": [-1.0]}, "tensor_split", "tensor_split entries must be finite and >= 0"),
    ({"tensor_split": [0, 0]}, "tensor_split", "tensor_split entries are all 0"),
    ({"tensor_split": []}, "tensor_split", "tensor_split is empty"),
    ({"split_mode": "tensor", "attn_split": [math.nan, 1]}, "attn_split", "attn_split entries must be finite"),
    ({"rpc_servers": "no-port"}, "rpc_servers", "bad RPC server 'no-port'"),
    ({"kv_overrides": {"": 1}}, "kv_overrides", "kv_overrides: keys must be non-empty strings"),
]


@pytest.mark.parametrize("kwargs, param, said", MODEL_RULES)
def test_model_rule_names_its_parameter(kwargs: dict[str, Any], param: str, said: str) -> None:
    with pytest.raises(ParamError, match=said) as e:
        ModelParams(**kwargs)
    assert e.value.param == param and param in str(e.value)


def test_split_longer_than_the_devices_names_it() -> None:
    n = n_devices()
    for param in ("tensor_split", "attn_split"):
        with pytest.raises(ParamError, match=f"{param} has {n + 1} entries but there are {n} device") as e:
            ModelParams(split_mode="tensor", **{param: [1] * (n + 1)})
        assert e.value.param == param
    # with RPC servers the count is theirs too, known once connected: only llama.cpp's maximum here
    assert ModelParams(tensor_split=[1] * (n + 1), rpc_servers="127.0.0.1:1").tensor_split == (1.0,) * (n + 1)


def test_main_gpu_out_of_range() -> None:
    if _llama.gpu_device_count() == 0:
        virtual_devices(2)  # without GPUs the rule has nothing to check against
    n = _llama.gpu_device_count()
    with pytest.raises(ParamError, match=f"main_gpu {n} out of range: {n} device") as e:
        ModelParams(split_mode="none", main_gpu=n)
    assert e.value.param == "main_gpu"
    assert ModelParams(split_mode="none", main_gpu=n - 1).main_gpu == n - 1


@pytest.mark.parametrize("mode", ["none", "layer", "row", 1])
def test_attn_split_needs_tensor_split_whatever_its_length(mode: str | int) -> None:
    """The split mode is the error, checked before the length: no device count makes it right."""
    with pytest.raises(TensorSplitOnlyError) as e:
        ModelParams(split_mode=mode, attn_split=[1] * (n_devices() + 5))
    assert (e.value.param, e.value.split_mode) == ("attn_split", _llama.split_mode_name(mode))
    assert str(e.value) == (f'attn_split needs split_mode="tensor" (got split_mode={e.value.split_mode!r}): '
                            "it splits the attention heads of tensor split")


CONTEXT_RULES: list[tuple[dict[str, Any], str, str]] = [
    ({"n_ctx": -1}, "n_ctx", "n_ctx must be >= 0"),
    ({"n_seq_max": 0}, "n_seq_max", "n_seq_max must be >= 1"),
    ({"flash_attn": "maybe"}, "flash_attn", "unknown flash_attn 'maybe'"),
    ({"type_k": "f12"}, "type_k", "unknown type_k 'f12'"),
    ({"type_v": 99}, "type_v", "unsupported type_v: ggml type id 99"),
    ({"pooling_type": "median"}, "pooling_type", "unknown pooling_type 'median'"),
]


@pytest.mark.parametrize("kwargs, param, said", CONTEXT_RULES)
def test_context_rule_names_its_parameter(kwargs: dict[str, Any], param: str, said: str) -> None:
    with pytest.raises(ParamError, match=said) as e:
        ContextParams(**kwargs)
    assert e.value.param == param


@pytest.mark.parametrize("kwargs, said", [
    ({"n_batch": 64, "n_ubatch": 128}, r"n_ubatch \(128\) must not exceed n_batch \(64\)"),
    ({"n_batch": 0}, "n_batch and n_ubatch must be >= 1, got 0 and 0"),
    ({"n_batch": 8, "n_ubatch": 0}, "n_batch and n_ubatch must be >= 1, got 8 and 0"),
])
def test_batch_rules(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        ContextParams(**kwargs)


@pytest.mark.parametrize("cls, kwargs, said", [
    (ContextParams, {"split_overlap": 1}, "split_overlap must be a bool"),
    (ContextParams, {"embeddings": "yes"}, "embeddings must be a bool"),
    (ContextParams, {"n_ctx": 1.5}, "n_ctx must be an int, not float"),
    (ContextParams, {"n_batch": True}, "n_batch must be an int, not bool"),
    (ModelParams, {"vocab_only": 0}, "vocab_only must be a bool"),
    (ModelParams, {"n_gpu_layers": "all"}, "n_gpu_layers must be an int, not str"),
])
def test_wrong_types_are_type_errors(cls: type, kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(TypeError, match=said):
        cls(**kwargs)


@pytest.mark.parametrize("mode", ["none", "layer", "row"])
def test_split_overlap_needs_tensor_split(mode: str) -> None:
    ctx = ContextParams(split_overlap=True)
    with pytest.raises(TensorSplitOnlyError) as e:
        config.check_combination(ModelParams(split_mode=mode), ctx)
    assert (e.value.param, e.value.split_mode) == ("split_overlap", mode)
    assert str(e.value) == (f'split_overlap needs split_mode="tensor" (got split_mode={mode!r}): the two lanes '
                            "overlap the AllReduces of tensor split")
    config.check_combination(ModelParams(split_mode="tensor"), ctx)


# -- one spelling of every field ---------------------------------------------------------------------------

def test_fields_are_normalised() -> None:
    mp = ModelParams(split_mode=3, tensor_split=[1], rpc_servers="a:1, b:2", kv_overrides={"k": 1, "s": "x"})
    assert (mp.split_mode, mp.tensor_split, mp.rpc_servers) == ("tensor", (1.0,), ("a:1", "b:2"))
    assert mp.kv_overrides == (("k", 1), ("s", "x")) and mp.kv_overrides_dict == {"k": 1, "s": "x"}
    assert ModelParams(split_mode="LAYER").split_mode == "layer"
    cp = ContextParams(flash_attn=True, type_k="Q8_0", pooling_type=1)
    assert (cp.flash_attn, cp.type_k, cp.pooling_type) == ("on", "q8_0", "mean")
    assert ContextParams(flash_attn=None).flash_attn == "auto" and ContextParams().pooling_type == "unspecified"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.n_ctx = 1  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, n_ubatch", [
    ({}, 512), ({"n_batch": 256}, 256), ({"split_overlap": True}, 1024), ({"split_overlap": True, "n_batch": 64}, 64),
    ({"embeddings": True, "n_batch": 1000}, 1000), ({"n_ubatch": 64}, 64),
])
def test_n_ubatch_default(kwargs: dict[str, Any], n_ubatch: int) -> None:
    """llama.cpp's 512 (at most n_batch), half of n_batch with split overlap (at least 64), all of n_batch for
    embeddings (one ubatch per batch); a given one stays."""
    assert ContextParams(**kwargs).n_ubatch == n_ubatch


# -- turning them into the bindings' objects -----------------------------------------------------------------

def test_load_model_and_create_context(tiny_model: Path) -> None:
    model = config.load_model(tiny_model, ModelParams(n_gpu_layers=0, kv_overrides={"qwen3.context_length": 1536}))
    try:
        ctx = config.create_context(model, ContextParams(n_ctx=0, n_batch=128, n_ubatch=32, n_seq_max=2,
                                                         n_threads=1))
        try:  # n_ctx=0: the training context, which the override set
            assert (ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_seq_max) == (1536, 128, 32, 2)
        finally:
            ctx.free()
        with pytest.raises(ValueError, match='pooling_type="rank" needs a reranking model'):
            config.create_context(model, ContextParams(n_ctx=256, embeddings=True, pooling_type="rank"))
    finally:
        model.free()


def test_llama_keeps_its_configuration(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_batch=64, n_threads=1, flash_attn=True) as llm:
        assert llm.model_params == ModelParams()
        assert llm.context_params.n_ubatch == 64 and llm.context_params.flash_attn == "on"
        assert llm.context_params.n_threads == 1


def test_allreduce_params_name_the_knob() -> None:
    with pytest.raises(ParamError, match="min_bytes must be >= 1") as e:
        allreduce.AllReduceParams(min_bytes=0)
    assert e.value.param == "min_bytes"
    assert allreduce.AllReduceParams(copy_engines=False, chunk_bytes=1 << 20).environment() == {
        allreduce.ENV_CE: "0", allreduce.ENV_CE_MIN_BYTES: None, allreduce.ENV_CE_CHUNK_BYTES: str(1 << 20),
        allreduce.ENV_LL_MAX_BYTES: None}
    with pytest.raises(ParamError, match="ll_max_bytes must be from 0") as e:
        allreduce.AllReduceParams(ll_max_bytes=-1)
    assert e.value.param == "ll_max_bytes"
    assert allreduce.AllReduceParams(ll_max_bytes=0).environment()[allreduce.ENV_LL_MAX_BYTES] == "0"


# -- one message from every entry point ------------------------------------------------------------------------

def _bad_inputs() -> list[tuple[dict[str, Any], list[str]]]:
    """(Llama's keyword arguments, the same as flags) that every entry point refuses."""
    too_long = [1] * (n_devices() + 1)
    return [
        ({"split_mode": "layer", "split_overlap": True}, ["-sm", "layer", "-so", "1"]),
        ({"split_mode": "row", "attn_split": [1, 3]}, ["-sm", "row", "-as", "1/3"]),
        ({"n_batch": 64, "n_ubatch": 128}, ["-b", "64", "-ub", "128"]),
        ({"tensor_split": too_long}, ["-ts", "/".join(map(str, too_long))]),
    ]


def _status(main: Any, argv: list[str]) -> int:
    """A tool's exit status, whether it returns it or exits as argparse does."""
    try:
        return int(main(argv))
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize("case", range(4), ids=["so-without-tensor", "as-without-tensor", "ub-over-b", "ts-too-long"])
def test_entry_points_refuse_alike(tiny_model: Path, capsys: pytest.CaptureFixture[str], case: int) -> None:
    """Llama raises the message; the server, the bench and the perplexity tool exit with status 2 saying it
    (the bench after "-b 64 -ub 128: " or "skipping -so 1 with -sm layer: ", as a list may mix values)."""
    kwargs, flags = _bad_inputs()[case]
    with pytest.raises(ValueError) as e:
        Llama(tiny_model, **kwargs)
    message = str(e.value)
    capsys.readouterr()
    tools = {"server": (server_main, []), "bench": (bench_main, ["-p", "8", "-n", "0", "-r", "1", "--no-progress"]),
             "perplexity": (perplexity_main, ["-c", "256", "--no-progress"])}
    for name, (main, extra) in tools.items():
        assert _status(main, ["-m", str(tiny_model), *extra, *flags]) == 2, name
        err = capsys.readouterr().err
        assert message in err, (name, message, err)

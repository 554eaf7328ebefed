"""Llama as llama-cpp-python 0.3.x's Llama: embeddings, vocab_only, save/load state, kv_overrides, LoRA,
logits_all, set_seed, metadata, token_nl, tokenize(bytes) and detokenize's BOS / leading-space rule.

Where a test states llama-cpp-python's behaviour, it comes from the 0.3.36 source distribution (the one
whose vendor/llama.cpp is our pin): llama_cpp/llama.py (Llama.embed, create_embedding, save_state,
load_state, LlamaState) and llama_cpp/_internals.py (LlamaModel.detokenize, normalize_embedding). It was
read, not run: llama-cpp-python is not installed here. Most tests use the tiny synthetic model; those
that need real text use SmolLM2-135M-Instruct and Gemma 3 270M from the model cache and skip without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from helpers.cuda_devices import cuda_device_count
from pyllama_so import Llama, LlamaError, ModelLoadError, _llama, synth, testing
from pyllama_so.archs import nmse
from pyllama_so.embeddings import embed_tokens, normalize
from pyllama_so.llama import LlamaState

PROMPT = "The quick brown fox jumps over the lazy dog"
TEXTS = ["hello world", "a", "The quick brown fox", "0123456789 and more"]
N_EMBD = synth.SHAPES["tiny"].n_embd
SMOLLM2 = synth.default_cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = synth.default_cache_dir() / "gemma-3-270m-q4_k_m.gguf"
# two computations of the same values: float32 on the CPU agrees to 1e-4; a CUDA build (the model offloaded,
# F16 products, reduction orders that depend on the batch shape) differs by up to about 2e-3
SAME = {"rtol": 5e-3, "atol": 5e-3} if cuda_device_count() > 0 else {"rtol": 1e-4, "atol": 1e-5}


def real_model(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path.name} is not in the model cache ({path.parent})")
    return path


@pytest.fixture(scope="module")
def embedder(tiny_model: Path) -> Iterator[Llama]:
    """The tiny model with embeddings and its default pooling ("none": it has no pooling key)."""
    with Llama(tiny_model, n_ctx=256, n_batch=64, embedding=True, n_threads=2) as llm:
        yield llm


# -- embeddings ---------------------------------------------------------------------------------------

def test_embed_needs_embedding_true(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        with pytest.raises(RuntimeError, match="embedding=True"):
            llm.embed("hello")


def test_default_pooling_none_gives_a_vector_per_token(embedder: Llama) -> None:
    assert embedder.pooling_type() == 0  # LLAMA_POOLING_TYPE_NONE: the model names no pooling
    out = embedder.embed("hello world")
    n = len(embedder.tokenize(b"hello world"))
    assert len(out) == n and all(len(row) == N_EMBD for row in out)
    assert all(isinstance(v, float) for v in out[0])
    assert np.isfinite(out).all() and np.abs(out).max() > 0


@pytest.mark.parametrize("pooling,code,pick", [("mean", 1, lambda h: h.mean(0)), ("cls", 2, lambda h: h[0]),
                                               ("last", 3, lambda h: h[-1]), (1, 1, lambda h: h.mean(0))])
def test_pooled_embeddings_pool_the_per_token_ones(tiny_model: Path, embedder: Llama, pooling: str | int,
                                                   code: int, pick) -> None:
    """llama.cpp's mean/cls/last pooling of the very vectors pooling "none" gives, for each text."""
    per_token = [np.array(embedder.embed(t)) for t in TEXTS]
    with Llama(tiny_model, n_ctx=256, n_batch=64, embedding=True, pooling_type=pooling, n_threads=2) as llm:
        assert llm.pooling_type() == code
        pooled = np.array(llm.embed(TEXTS))
    assert pooled.shape == (len(TEXTS), N_EMBD)
    for h, p in zip(per_token, pooled, strict=True):
        np.testing.assert_allclose(p, pick(h), **SAME)


def test_inputs_batched_together_equal_each_alone(tiny_model: Path) -> None:
    """Several inputs share a batch (one sequence each), and n_batch=16 splits these into several batches:
    each input's embedding is the one it has alone."""
    many = TEXTS * 3
    with Llama(tiny_model, n_ctx=256, n_batch=16, embedding=True, pooling_type="mean", n_threads=2) as llm:
        together = np.array(llm.embed(many))
        alone = np.array([llm.embed(t) for t in many])
    np.testing.assert_allclose(together, alone, **SAME)
    assert not np.allclose(together[0], together[1])  # different texts, different vectors


def test_normalize_is_euclidean_and_off_by_default(tiny_model: Path) -> None:
    """llama-cpp-python 0.3.36: embed(normalize=False) by default; normalize=True divides by the L2 norm
    (_internals.normalize_embedding), per token with pooling "none"."""
    with Llama(tiny_model, n_ctx=256, embedding=True, pooling_type="mean", n_threads=2) as llm:
        raw = np.array(llm.embed("hello world"))
        unit = np.array(llm.embed("hello world", normalize=True))
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw), rtol=1e-5)
    assert np.linalg.norm(unit) == pytest.approx(1.0, abs=1e-5)


def test_normalize_per_token_with_pooling_none(embedder: Llama) -> None:
    rows = np.array(embedder.embed("hello world", normalize=True))
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)


def test_normalize_follows_llama_servers_rules() -> None:
    v = np.array([3.0, -4.0], dtype=np.float32)
    np.testing.assert_allclose(normalize(v, 2), [0.6, -0.8])
    np.testing.assert_allclose(normalize(v, 1), [3 / 7, -4 / 7])
    np.testing.assert_allclose(normalize(v, 0), v * 32760 / 4)
    np.testing.assert_allclose(normalize(v, -1), v)
    np.testing.assert_allclose(normalize(v, 3), v / (27 + 64) ** (1 / 3), rtol=1e-6)
    assert not normalize(np.zeros(3, dtype=np.float32)).any()
    with pytest.raises(ValueError, match="embd_normalize"):
        normalize(v, -2)


def test_truncate_return_count_and_input_types(tiny_model: Path) -> None:
    long_text = "word " * 100  # more tokens than n_batch
    with Llama(tiny_model, n_ctx=256, n_batch=32, embedding=True, pooling_type="mean", n_threads=2) as llm:
        n_short = len(llm.tokenize(b"hello"))
        out, count = llm.embed(["hello", long_text], return_count=True)
        assert count == n_short + 32  # the long input cut to n_batch tokens, as llama-cpp-python
        assert len(out) == 2 and len(out[1]) == N_EMBD
        with pytest.raises(ValueError, match="32"):
            llm.embed(long_text, truncate=False)
        single = llm.embed("hello")
        assert isinstance(single[0], float)  # a str gives one vector, a list a list of them
        assert llm.embed(["hello"]) == [single]
        with pytest.raises(ValueError, match="input"):
            llm.embed(b"hello")  # type: ignore[arg-type]


def test_create_embedding_has_llama_cpp_pythons_shape(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, embedding=True, pooling_type="last", n_threads=2) as llm:
        res = llm.create_embedding(["hello", "world"])
        assert res["object"] == "list" and res["model"] == str(tiny_model)
        assert [d["index"] for d in res["data"]] == [0, 1]
        assert all(d["object"] == "embedding" and len(d["embedding"]) == N_EMBD for d in res["data"])
        n = len(llm.tokenize(b"hello")) + len(llm.tokenize(b"world"))
        assert res["usage"] == {"prompt_tokens": n, "total_tokens": n}
        assert res["data"][0]["embedding"] == llm.embed("hello")  # not normalised, as embed()
        one = llm.create_embedding("hello", model="my-name")
        assert one["model"] == "my-name" and len(one["data"]) == 1


def test_bad_pooling_is_a_value_error(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="pooling_type"):
        Llama(tiny_model, n_ctx=256, embedding=True, pooling_type="max")
    with pytest.raises(ValueError, match="pooling_type"):
        Llama(tiny_model, n_ctx=256, embedding=True, pooling_type=7)
    with pytest.raises(ValueError, match="reranking model"):
        Llama(tiny_model, n_ctx=256, embedding=True, pooling_type="rank")


def test_encoder_decoder_model_cannot_embed() -> None:
    model = testing.arch_model("t5", False, [])
    try:
        assert model.has_encoder and model.has_decoder
        ctx = _llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, embeddings=True)
        try:
            with pytest.raises(ValueError, match="encoder-decoder"):
                embed_tokens(ctx, [[1, 2, 3]])
        finally:
            ctx.free()
    finally:
        model.free()


def test_embedding_llama_still_generates_the_same(tiny_model: Path) -> None:
    """embed() switches the context's embeddings on only while it runs: greedy completions before and
    after it equal a plain Llama's, and embed() gives the same vectors after a completion."""
    with Llama(tiny_model, n_ctx=256, n_batch=64, n_threads=2) as plain:
        want = plain.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"]
    with Llama(tiny_model, n_ctx=256, n_batch=64, embedding=True, pooling_type="mean", n_threads=2) as llm:
        first = llm.embed("hello")
        assert llm.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"] == want
        assert llm.embed("hello") == first
        assert llm.n_tokens == 0  # embedding cleared the context
        assert llm.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"] == want


def test_mean_embeddings_of_real_text_rank_similar_sentences_first() -> None:
    with Llama(real_model(SMOLLM2), n_ctx=512, embedding=True, pooling_type="mean", n_threads=2) as llm:
        cat, cat2, stocks = np.array(llm.embed(["The cat sat on the mat.", "A cat was sitting on a mat.",
                                                "Stock prices fell sharply on Monday."], normalize=True))
    assert cat @ cat2 > cat @ stocks + 0.1  # measured: 0.953 vs 0.746
    assert cat2 @ cat > cat2 @ stocks + 0.1


# -- vocab_only -----------------------------------------------------------------------------------------

def test_vocab_only_tokenizes_and_refuses_evaluation(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as full:
        want_tokens = full.tokenize(PROMPT)
        want_meta = full.metadata
    with Llama(tiny_model, vocab_only=True) as llm:
        assert llm.tokenize(PROMPT) == want_tokens
        assert llm.detokenize(want_tokens) == PROMPT.encode()
        assert llm.metadata == want_meta
        assert (llm.n_vocab(), llm.token_bos(), llm.token_eos(), llm.token_nl()) == (512, 1, 2, 13)
        for call in (lambda: llm.eval(want_tokens), lambda: llm.create_completion(PROMPT, max_tokens=2),
                     lambda: list(llm.generate(want_tokens, max_tokens=2)), lambda: llm.save_state(),
                     lambda: llm.embed("x"), lambda: llm.n_ctx()):
            with pytest.raises(RuntimeError, match="vocab_only=True"):
                call()
    assert llm.closed
    with pytest.raises(ValueError, match="lora_path"):
        Llama(tiny_model, vocab_only=True, lora_path=tiny_model)


# -- save_state / load_state ----------------------------------------------------------------------------

def greedy(llm: Llama, tokens: list[int], n: int = 12) -> list[int]:
    return list(llm.generate(tokens, max_tokens=n, temperature=0))


def test_load_state_restores_the_context(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2, seed=3) as llm:
        tokens = llm.tokenize(PROMPT)
        llm.eval(tokens)
        state = llm.save_state()
        assert isinstance(state, LlamaState)
        assert state.n_tokens == len(tokens) and state.input_ids.tolist() == tokens
        assert state.input_ids.dtype == np.intc and state.seed == 3
        assert state.llama_state_size == len(state.llama_state) > 0
        after_save = greedy(llm, tokens)
        llm.reset()
        llm.eval(llm.tokenize("something else entirely"))
        llm.load_state(state)
        assert llm.n_tokens == len(tokens) and llm.input_ids.tolist() == tokens
        # only the last prompt token is evaluated again: the rest comes from the restored KV cache
        assert greedy(llm, tokens) == after_save
    with Llama(tiny_model, n_ctx=256, n_threads=2) as other:  # a fresh Llama on the same model
        other.load_state(state)
        restored_logits = other.eval([after_save[0]])
    with Llama(tiny_model, n_ctx=256, n_threads=2) as ref:
        ref.eval(tokens)
        want = ref.eval([after_save[0]])
    np.testing.assert_array_equal(restored_logits, want)


def test_load_state_continues_the_random_sequence(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2, seed=11) as llm:
        tokens = llm.tokenize(PROMPT)
        llm.eval(tokens)
        state = llm.save_state()
        first = list(llm.generate(tokens, max_tokens=16, temperature=1.0))  # seed from the Llama's generator
        llm.load_state(state)
        assert list(llm.generate(tokens, max_tokens=16, temperature=1.0)) == first


def test_a_broken_state_is_an_error_and_the_llama_goes_on(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        tokens = llm.tokenize(PROMPT)
        llm.eval(tokens)
        state = llm.save_state()
        want = greedy(llm, tokens)
        half = len(state.llama_state) // 2
        cut = LlamaState(state.input_ids, state.scores, state.n_tokens, state.llama_state[:half], half, state.seed)
        with pytest.raises(LlamaError, match="llama_state_set_data"):
            llm.load_state(cut)
        assert llm.n_tokens == 0
        assert greedy(llm, tokens) == want
        with pytest.raises(ValueError, match="n_tokens"):
            llm.load_state(LlamaState(state.input_ids, state.scores, 999, state.llama_state,
                                      state.llama_state_size, None))


# -- kv_overrides -----------------------------------------------------------------------------------------

def test_kv_overrides_of_each_type_take_effect(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as base:
        tokens = base.tokenize(PROMPT)
        base_logits = base.eval(tokens)
    # bool: no BOS; int: the training context (n_ctx=0 takes it)
    with Llama(tiny_model, n_ctx=0, kv_overrides={"tokenizer.ggml.add_bos_token": False,
                                                  "qwen3.context_length": 512}) as llm:
        assert llm.tokenize(PROMPT) == tokens[1:]
        assert llm.n_ctx() == 512
        assert llm.metadata["qwen3.context_length"] == "4096"  # metadata shows the file, as llama.cpp's API
    # float: another RoPE base changes the logits
    with Llama(tiny_model, n_ctx=256, n_threads=2, kv_overrides={"qwen3.rope.freq_base": 10.0}) as llm:
        assert nmse(base_logits, llm.eval(tokens)) > 1e-4
    # an int for the pooling key sets the model's default pooling
    with Llama(tiny_model, n_ctx=256, embedding=True, kv_overrides={"qwen3.pooling_type": 1}) as llm:
        assert llm.pooling_type() == 1
    # str: accepted; a value of the wrong type for its key is ignored by llama.cpp (with a warning)
    with Llama(tiny_model, n_ctx=0, kv_overrides={"general.name": "renamed", "qwen3.context_length": "x"}) as llm:
        assert llm.n_ctx() == 4096


@pytest.mark.parametrize("bad,match", [({"k": [1]}, "unsupported value type"), ({"k": None}, "unsupported"),
                                       ({"": 1}, "non-empty"), ({"k" * 128: 1}, "longer than 127"),
                                       ({"k": "v" * 128}, "longer than 127"), ({"k": 2**63}, "64-bit")])
def test_bad_kv_overrides_are_value_errors(tiny_model: Path, bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Llama(tiny_model, n_ctx=256, kv_overrides=bad)


# -- LoRA ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A rank-4 LoRA of the tiny model's output projection, and its factors A (4, n_embd), B (n_vocab, 4)."""
    weights = synth.lora_weights("tiny", ("output.weight",), rank=4, seed=5)
    path = synth.write_lora(tmp_path_factory.mktemp("lora") / "output.gguf", weights)
    return path, *weights["output.weight"]


@pytest.mark.parametrize("scale", [1.0, 0.5, -2.0])
def test_lora_adds_scale_times_b_a_to_the_output(tiny_model: Path, lora_output: tuple[Path, np.ndarray, np.ndarray],
                                                 scale: float) -> None:
    """llama.cpp's LoRA on the output projection: logits = W h + scale * B (A h), where h (the normed final
    hidden state) is what embeddings with pooling "none" give."""
    path, a, b = lora_output
    with Llama(tiny_model, n_ctx=256, embedding=True, n_threads=2) as base:
        tokens = base.tokenize(PROMPT)
        h = np.array(base.embed(PROMPT))
        logits = base.eval(tokens)
    with Llama(tiny_model, n_ctx=256, lora_path=path, lora_scale=scale, lora_base="ignored", n_threads=2) as llm:
        assert (llm.lora_path, llm.lora_scale, llm.lora_base) == (str(path), scale, "ignored")
        got = llm.eval(tokens)
    np.testing.assert_allclose(got, logits + scale * (h @ a.T @ b.T), **{**SAME, "atol": max(SAME["atol"], 1e-4)})
    assert np.abs(got - logits).max() > 0.01


def test_lora_alpha_scales_by_alpha_over_rank(tiny_model: Path, tmp_path: Path,
                                              lora_output: tuple[Path, np.ndarray, np.ndarray]) -> None:
    path, a, b = lora_output
    with_alpha = synth.write_lora(tmp_path / "alpha.gguf", {"output.weight": (a, b)}, alpha=2.0)  # 2 / 4 = 0.5
    with Llama(tiny_model, n_ctx=256, lora_path=path, lora_scale=0.5, n_threads=2) as half:
        want = half.eval(half.tokenize(PROMPT))
    with Llama(tiny_model, n_ctx=256, lora_path=with_alpha, n_threads=2) as llm:
        np.testing.assert_allclose(llm.eval(llm.tokenize(PROMPT)), want, **(SAME if cuda_device_count() else
                                                                             {"rtol": 1e-5, "atol": 1e-5}))


def test_lora_of_attention_and_ffn_changes_generation_reproducibly(tiny_model: Path, tmp_path: Path) -> None:
    weights = synth.lora_weights("tiny", ("blk.0.attn_q.weight", "blk.1.ffn_down.weight"), rank=8, seed=1, stdev=0.5)
    path = synth.write_lora(tmp_path / "layers.gguf", weights)
    with Llama(tiny_model, n_ctx=256, n_threads=2) as base:
        tokens = base.tokenize(PROMPT)
        base_logits = base.eval(tokens)
    runs = []
    for _ in range(2):
        with Llama(tiny_model, n_ctx=256, lora_path=path, n_threads=2) as llm:
            runs.append(llm.eval(tokens))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert nmse(base_logits, runs[0]) > 1e-4
    with Llama(tiny_model, n_ctx=256, lora_path=path, lora_scale=0.0, n_threads=2) as off:
        np.testing.assert_array_equal(off.eval(tokens), base_logits)  # scale 0: llama.cpp leaves it out


def test_bad_lora_files_are_clear_errors(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="LoRA adapter not found"):
        Llama(tiny_model, n_ctx=256, lora_path=tmp_path / "missing.gguf")
    a = np.zeros((4, 64), dtype=np.float32)  # n_in 64: the output projection takes 128
    wrong = synth.write_lora(tmp_path / "wrong.gguf", {"output.weight": (a, np.zeros((512, 4), dtype=np.float32))})
    with pytest.raises(ModelLoadError, match="incorrect shape"):
        Llama(tiny_model, n_ctx=256, lora_path=wrong)
    other_arch = synth.write_lora(tmp_path / "arch.gguf", synth.lora_weights("tiny"), arch="llama")
    with pytest.raises(ModelLoadError, match="arch"):
        Llama(tiny_model, n_ctx=256, lora_path=other_arch)
    with pytest.raises(ValueError, match="lora_scale"):
        Llama(tiny_model, n_ctx=256, lora_path=other_arch, lora_scale=float("nan"))


# -- logits_all, input_ids, n_tokens -------------------------------------------------------------------------

def test_logits_all_keeps_every_row_through_generation(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, logits_all=True, n_threads=2) as llm:
        prompt = llm.tokenize(PROMPT)
        out = llm.create_completion(PROMPT, max_tokens=10, temperature=0)
        ids = llm.input_ids.tolist()
        n = llm.n_tokens
        assert n == len(ids) == len(prompt) + out["usage"]["completion_tokens"] - 1  # the last one is not decoded
        rows = np.array(llm.eval_logits)
        assert rows.shape == (n, 512) and llm.scores.shape == (256, 512)
        np.testing.assert_array_equal(rows, llm.scores[:n])
        # greedy: every row from the prompt's last token on picks the next token held
        assert [int(r.argmax()) for r in rows[len(prompt) - 1:-1]] == ids[len(prompt):]
        assert list(llm.eval_tokens) == ids
    with Llama(tiny_model, n_ctx=256, n_threads=2) as ref:
        assert nmse(ref.eval(ids), rows) < 1e-5  # one batch vs token by token: as test_llama.py's rule


def test_scores_need_logits_all(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        llm.eval(llm.tokenize(PROMPT))
        with pytest.raises(RuntimeError, match="logits_all=True"):
            _ = llm.scores
        with pytest.raises(RuntimeError, match="logits_all=True"):
            _ = llm.eval_logits


def test_logits_all_rows_survive_save_and_load(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, logits_all=True, n_threads=2) as llm:
        tokens = llm.tokenize(PROMPT)
        logits = llm.eval(tokens)
        state = llm.save_state()
        assert state.scores.shape == (len(tokens), 512)
        llm.reset()
        llm.eval(tokens[:3][::-1])
        llm.load_state(state)
        np.testing.assert_array_equal(llm.scores[: len(tokens)], logits)


def test_setting_n_tokens_drops_the_rest(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        tokens = llm.tokenize(PROMPT)
        full = llm.eval(tokens)
        llm.n_tokens = 4
        assert llm.input_ids.tolist() == tokens[:4]
        again = llm.eval(tokens[4:])
        assert nmse(full[4:], again) < 1e-5
        with pytest.raises(ValueError, match="n_tokens"):
            llm.n_tokens = len(tokens) + 1


# -- seeds, metadata, token_nl, tokenize -----------------------------------------------------------------------

def test_set_seed_replays_like_a_new_llama(tiny_model: Path) -> None:
    def sample(llm: Llama) -> str:
        return llm.create_completion(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]

    with Llama(tiny_model, n_ctx=256, seed=7, n_threads=2) as fresh:
        want = [sample(fresh), sample(fresh)]
    with Llama(tiny_model, n_ctx=256, seed=1, n_threads=2) as llm:
        sample(llm)
        llm.set_seed(7)
        assert [sample(llm), sample(llm)] == want
        llm.set_seed(7)
        assert sample(llm) == want[0]
        with pytest.raises(ValueError, match="seed"):
            llm.set_seed("7")  # type: ignore[arg-type]


def test_a_state_carries_the_seed_in_use_when_none_was_given(tiny_model: Path) -> None:
    """Without a seed (or with -1, llama.cpp's random one) the Llama draws one: the state names it, and a
    Llama made with it samples the same, as llama-cpp-python's state carries its seed."""
    def sample(llm: Llama) -> str:
        return llm.create_completion(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]

    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        seed = llm.save_state().seed
        assert isinstance(seed, int) and 0 <= seed < 2**32
        want = sample(llm)
        llm.set_seed(-1)
        assert isinstance(llm.save_state().seed, int)
    with Llama(tiny_model, n_ctx=256, n_threads=2, seed=seed) as replay:
        assert sample(replay) == want
    with Llama(tiny_model, n_ctx=256, n_threads=2, seed=-1) as random_seed:
        assert isinstance(random_seed.save_state().seed, int)


def test_metadata_is_every_scalar_key_as_a_string(tiny_model: Path) -> None:
    written = synth.metadata(synth.SHAPES["tiny"], "f16", "tiny")
    with Llama(tiny_model, n_ctx=256) as llm:
        meta = llm.metadata
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    for key, value in written.items():
        if isinstance(value, (list, np.ndarray)):
            assert key not in meta  # arrays: not in llama.cpp's metadata API, nor llama-cpp-python's dict
        elif isinstance(value, bool):
            assert meta[key] == str(value).lower()
        elif isinstance(value, (int, str)):
            assert meta[key] == str(value)
        else:
            assert float(meta[key]) == pytest.approx(value)


def test_token_nl_and_tokenize_bytes(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        assert llm.token_nl() == llm.tokenize(b"\n", add_bos=False)[0] == 3 + ord("\n")  # the byte token
        assert llm.tokenize(b"hello") == llm.tokenize("hello") == [1] + llm.tokenize(b"hello", add_bos=False)
        assert llm.tokenize(b"<s>x", add_bos=False, special=True)[0] == llm.token_bos()
        assert llm.tokenize(b"<s>x", add_bos=False)[0] != llm.token_bos()


# -- detokenize: llama-cpp-python's rule ------------------------------------------------------------------------
# llama-cpp-python 0.3.36 (_internals.LlamaModel.detokenize) joins llama_token_to_piece(token, lstrip=0,
# special) of every token and then drops the first byte when the first token is BOS and that byte is a
# space; prev_tokens is not used (llama_tokenizer.LlamaTokenizer.detokenize). The expected bytes below
# follow from that rule applied to these tokens; they were not produced by a llama-cpp-python run.

def test_detokenize_drops_one_space_after_bos(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        tokens = llm.tokenize(b"  two spaces")  # [BOS, "▁", "▁t", ...]: add_space_prefix is off
        assert tokens[0] == llm.token_bos()
        assert llm.detokenize(tokens) == b" two spaces"
        assert llm.detokenize(tokens[1:]) == b"  two spaces"
        assert llm.detokenize(tokens, special=True) == b"<s>  two spaces"  # "<s>" first: nothing dropped
        assert llm.detokenize(tokens, prev_tokens=[1, 2, 3]) == b" two spaces"
        assert llm.detokenize([]) == b""
        assert llm.detokenize([llm.token_bos(), llm.token_eos()], special=True) == b"<s></s>"


def test_detokenize_of_gemma3_real_tokens() -> None:
    """Gemma 3 (SentencePiece, adds BOS 2, no space prefix): tokenize(b" Hello") is [2, 26352]."""
    with Llama(real_model(GEMMA3), n_ctx=256) as llm:
        tokens = llm.tokenize(b" Hello")
        assert tokens == [2, 26352]
        assert llm.detokenize(tokens) == b"Hello"
        assert llm.detokenize(tokens[1:]) == b" Hello"
        assert llm.detokenize(tokens, special=True) == b"<bos> Hello"
        assert llm.detokenize(llm.tokenize(b"Hello world")) == b"Hello world"


def test_detokenize_of_smollm2_real_tokens() -> None:
    """SmolLM2 (GPT-2 BPE, adds no BOS; BOS is <|im_start|>, id 1): " Hello" is the one token 38699."""
    with Llama(real_model(SMOLLM2), n_ctx=256) as llm:
        assert llm.tokenize(b" Hello") == [38699]
        assert llm.detokenize([38699]) == b" Hello"
        assert llm.detokenize([1, 38699]) == b"Hello"
        assert llm.detokenize([1, 38699], special=True) == b"<|im_start|> Hello"
        assert llm.token_nl() == 198


def test_tokenizer_is_llama_cpp_pythons(tiny_model: Path) -> None:
    """Llama.tokenizer(): encode / decode on str, tokenize / detokenize on bytes, with llama-cpp-python's defaults
    (special tokens parsed by encode and tokenize); from_ggml_file reads a vocabulary alone."""
    from pyllama_so import LlamaTokenizer
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        tok = llm.tokenizer()
        assert isinstance(tok, LlamaTokenizer)
        ids = tok.encode("hello world")
        assert ids == llm.tokenize(b"hello world", add_bos=True, special=True)
        assert tok.decode(ids) == llm.detokenize(ids).decode("utf-8")
        assert tok.tokenize(b"hello world", add_bos=False) == llm.tokenize(b"hello world", add_bos=False, special=True)
        assert tok.detokenize(ids) == llm.detokenize(ids)
    vocab = LlamaTokenizer.from_ggml_file(tiny_model)
    assert vocab.encode("hello world") == ids


def test_a_pickled_llama_loads_the_model_again(tiny_model: Path) -> None:
    """As llama-cpp-python: pickling keeps the constructor's arguments, and the copy answers as the original."""
    import pickle
    with Llama(tiny_model, n_ctx=256, n_threads=2, seed=3) as llm:
        want = llm.create_completion("Hello", max_tokens=6, temperature=0)["choices"][0]["text"]
        blob = pickle.dumps(llm)
    copy = pickle.loads(blob)
    try:
        assert copy.model_path == str(tiny_model) and copy.n_ctx() == 256
        assert copy.create_completion("Hello", max_tokens=6, temperature=0)["choices"][0]["text"] == want
    finally:
        copy.close()


def test_create_chat_completion_openai_v1_gives_the_openai_packages_types(tiny_model: Path) -> None:
    openai_chat = pytest.importorskip("openai.types.chat")
    messages = [{"role": "user", "content": "Hello"}]
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        want = llm.create_chat_completion(messages, max_tokens=5, temperature=0)
        got = llm.create_chat_completion_openai_v1(messages, max_tokens=5, temperature=0)
        assert isinstance(got, openai_chat.ChatCompletion)
        assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
        assert got.usage is not None and got.usage.completion_tokens == want["usage"]["completion_tokens"]
        chunks = list(llm.create_chat_completion_openai_v1(messages, max_tokens=5, temperature=0, stream=True))
        assert all(isinstance(c, openai_chat.ChatCompletionChunk) for c in chunks)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == want["choices"][0]["message"]["content"]

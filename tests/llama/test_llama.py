"""Llama: evaluation is deterministic and consistent across batching; the lifetime is safe."""

from __future__ import annotations

import gc
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from pyllama_so import ContextFullError, Llama, synth
from pyllama_so.archs import nmse

PROMPT = "The quick brown fox jumps over the lazy dog. 0123456789"


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> tuple[list[int], np.ndarray]:
    """The prompt's tokens and their logits with the default batch sizes."""
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        tokens = llm.tokenize(PROMPT)
        return tokens, llm.eval(tokens)


def test_logits_finite_and_repeatable(tiny_model: Path, reference: tuple[list[int], np.ndarray]) -> None:
    tokens, first = reference
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        runs = [first, llm.eval(llm.tokenize(PROMPT))]
    assert runs[0].shape == (len(tokens), 512)
    assert np.isfinite(runs[0]).all()
    assert np.abs(runs[0]).max() > 0  # not an all-zero output
    np.testing.assert_array_equal(runs[0], runs[1])


def test_batched_eval_equals_token_by_token(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        tokens = llm.tokenize(PROMPT)
        batched = llm.eval(tokens)
        llm.reset()
        assert llm.n_tokens == 0
        stepwise = np.concatenate([llm.eval([t]) for t in tokens])
        assert llm.n_tokens == len(tokens)
    assert nmse(batched, stepwise) < 1e-5


# (The reference runs at n_ctx 256, which llama.cpp also makes its batch and ubatch size.)
@pytest.mark.parametrize("n_ubatch,n_batch", [(1, 8), (7, 7), (16, 64), (32, 32)])
def test_ubatch_sizes_agree(tiny_model: Path, reference: tuple[list[int], np.ndarray], n_ubatch: int,
                            n_batch: int) -> None:
    tokens, ref = reference
    with Llama(tiny_model, n_ctx=256, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=2) as llm:
        got = llm.eval(tokens)
    assert nmse(ref, got) < 1e-5


@pytest.mark.parametrize("text", ["hello world", "héllo wörld ✓ 漢字", " leading and  double  spaces\n\ttabs", ""])
def test_tokenize_detokenize_round_trip(tiny_model: Path, text: str) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        tokens = llm.tokenize(text)
        assert tokens[:1] == [llm.token_bos()]
        assert all(0 <= t < llm.n_vocab() for t in tokens)
        # llama-cpp-python 0.3.x drops one leading space after a BOS (tests/llama/test_llama_compat.py)
        assert llm.detokenize(tokens).decode("utf-8") == (text[1:] if text.startswith(" ") else text)
        assert llm.detokenize(tokens[1:]).decode("utf-8") == text
        assert llm.tokenize(text, add_bos=False) == tokens[1:]


def test_close_is_idempotent_and_blocks_use(tiny_model: Path) -> None:
    llm = Llama(tiny_model, n_ctx=256)
    model = llm.model
    llm.close()
    llm.close()
    assert llm.closed and model.closed
    with pytest.raises(ValueError, match="closed"):
        llm.tokenize("x")
    with pytest.raises(ValueError, match="closed"):
        llm.eval([1])


def test_context_manager_frees_context_before_model(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        ctx, model = llm.context, llm.model
        # the model refuses to go while its context lives
        with pytest.raises(RuntimeError, match="context"):
            model.free()
    assert ctx.closed and model.closed


def test_greedy_generation_is_deterministic(tiny_model: Path) -> None:
    outs = []
    for _ in range(2):
        with Llama(tiny_model, n_ctx=256) as llm:
            outs.append(list(llm.generate(llm.tokenize("abc"), max_tokens=12, temperature=0.0, stop_on_eog=False)))
    assert len(outs[0]) == 12
    assert outs[0] == outs[1]


def test_greedy_generation_matches_argmax_of_eval(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        prompt = llm.tokenize("abc")
        gen = list(llm.generate(prompt, max_tokens=4, temperature=0.0, stop_on_eog=False))
        llm.reset()
        logits = llm.eval(prompt + gen[:-1])
    assert [int(np.argmax(row)) for row in logits[len(prompt) - 1:]] == gen


def test_sampled_generation_follows_the_seed(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        prompt = llm.tokenize("abc")
        kw = dict(max_tokens=16, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, stop_on_eog=False)
        runs = []
        for seed in (1, 1, 2):
            llm.reset()  # the same computation each time: GPU logits depend on the batch shapes
            runs.append(list(llm.generate(prompt, seed=seed, **kw)))
        a, b, c = runs
    assert a == b
    assert a != c


def test_max_tokens_none_0_and_negative_mean_to_the_end_of_the_context(tiny_model: Path) -> None:
    """llama-cpp-python's rule (llama_cpp/llama.py of 0.3.36: `if max_tokens is None or max_tokens <= 0`,
    unlimited up to n_ctx), in create_completion and generate alike; anything but an integer or None is a
    ValueError naming max_tokens."""
    with Llama(tiny_model, n_ctx=256) as llm:
        prompt = llm.tokenize("abc")
        to_the_end = list(llm.generate(prompt, max_tokens=None, temperature=0.0, stop_on_eog=False))
        assert len(prompt) + len(to_the_end) == 256  # prompt and completion fill the context exactly
        llm.reset()
        llm.eval(prompt + to_the_end)  # so the text can be evaluated in it, as with llama-cpp-python
        for n in (0, -1, -100):
            assert list(llm.generate(prompt, max_tokens=n, temperature=0.0, stop_on_eog=False)) == to_the_end, n
        want = llm.create_completion("abc", max_tokens=None, temperature=0.0)
        for n in (0, -1):
            out = llm.create_completion("abc", max_tokens=n, temperature=0.0)
            assert (out["choices"][0], out["usage"]) == (want["choices"][0], want["usage"]), n
        for bad in ("5", 2.5, True):
            with pytest.raises(ValueError, match="max_tokens"):
                llm.create_completion("abc", max_tokens=bad)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="max_tokens"):
                next(llm.generate(prompt, max_tokens=bad))  # type: ignore[arg-type]


def test_a_prompt_that_fills_the_context_is_a_value_error_as_in_llama_cpp_python(tiny_model: Path) -> None:
    """llama-cpp-python raises ValueError("Requested tokens (N) exceed context window of M") for a prompt of n_ctx
    tokens or more; ours is also a ContextFullError, and one token less generates one token."""
    with Llama(tiny_model, n_ctx=256) as llm:
        for n in (256, 257):
            for call in (lambda n=n: llm.create_completion([1] * n, max_tokens=4),
                         lambda n=n: llm.create_completion([1] * n, max_tokens=1, echo=True, logprobs=1),
                         lambda n=n: next(llm.generate([1] * n))):
                with pytest.raises(ValueError, match=rf"Requested tokens \({n}\) exceed context window of 256"):
                    call()
        with pytest.raises(ContextFullError):
            llm.create_completion([1] * 256)
        out = llm.create_completion([1] * 255, max_tokens=4, temperature=0)
        assert out["usage"]["completion_tokens"] == 1 and out["choices"][0]["finish_reason"] == "length"


def test_create_completion(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        out = llm.create_completion("abc", max_tokens=8, temperature=0.0)
        assert out["object"] == "text_completion"
        choice = out["choices"][0]
        assert choice["finish_reason"] in ("length", "stop")
        assert out["usage"]["prompt_tokens"] == len(llm.tokenize("abc"))
        assert out["usage"]["completion_tokens"] <= 8
        streamed = "".join(c["choices"][0]["text"] for c in llm("abc", max_tokens=8, temperature=0.0, stream=True))
        assert streamed == choice["text"]
        echoed = llm("abc", max_tokens=2, temperature=0.0, echo=True)["choices"][0]["text"]
        assert echoed.startswith("abc")


def test_create_completion_stops_at_stop_string(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        prompt = llm.tokenize("abc")
        gen = list(llm.generate(prompt, max_tokens=48, temperature=0.0))
        full = llm.detokenize(gen)
        # a stop string: the first generated piece that is printable ASCII
        pieces = [llm.model.token_to_piece(t) for t in gen[1:]]
        stops = [p for p in pieces if p and p.isascii() and p.decode().isprintable()]
        if not stops:
            pytest.skip("the random model generated no printable ASCII piece")
        stop = stops[0].decode()
        out = llm.create_completion(prompt, max_tokens=48, temperature=0.0, stop=[stop])
    assert out["choices"][0]["text"] == full[: full.find(stop.encode())].decode("utf-8", "replace")
    assert out["choices"][0]["finish_reason"] == "stop"


def test_prompt_prefix_is_reused(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        p = llm.tokenize("abcdef")
        assert len(p) > 1
        first = list(llm.generate(p, max_tokens=3, temperature=0.0, stop_on_eog=False))
        assert llm.n_tokens == len(p) + 2  # the last sampled token is never evaluated
        real = llm._prefill
        decoded: list[int] = []

        def counting_prefill(tokens: list[int]) -> int:  # records how many prompt tokens are evaluated
            decoded.append(real(tokens))
            return decoded[-1]

        llm._prefill = counting_prefill  # type: ignore[method-assign]
        try:
            again = list(llm.generate(p, max_tokens=3, temperature=0.0, stop_on_eog=False))
        finally:
            del llm._prefill
    assert first == again
    assert decoded[0] == 1  # the cached prompt was kept: only its last token is evaluated again


def _completion_texts(llm: Llama, prompt: str | list[int], **kw: object) -> list[str]:
    """The text of create_completion, of its stream (chunks joined) and of __call__, each from an empty context."""
    texts = []
    for stream, call in ((False, llm.create_completion), (True, llm.create_completion), (False, llm)):
        llm.reset()  # the same computation each time
        out = call(prompt, stream=stream, **kw)  # type: ignore[operator]
        chunks = out if stream else [out]
        texts.append("".join(c["choices"][0]["text"] for c in chunks))  # type: ignore[union-attr]
    return texts


@pytest.mark.parametrize("prompt", ["Hello", "abc", "The quick"])
def test_completion_text_is_the_detokenized_tokens(tiny_model: Path, prompt: str) -> None:
    """Invalid UTF-8 bytes in the output are replaced, never lost: plain, streamed and called text all
    equal detokenize(generate(...)) decoded with errors="replace"."""
    with Llama(tiny_model, n_ctx=256) as llm:
        gen = list(llm.generate(llm.tokenize(prompt), max_tokens=64, temperature=0.0))
        want = llm.detokenize(gen).decode("utf-8", "replace")
        assert "\ufffd" in want  # the byte-fallback vocabulary of the random model yields invalid bytes
        assert _completion_texts(llm, prompt, max_tokens=64, temperature=0.0) == [want] * 3


def test_completion_stop_string_after_invalid_bytes(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        gen = list(llm.generate(llm.tokenize("Hello"), max_tokens=64, temperature=0.0))
        want = llm.detokenize(gen).decode("utf-8", "replace")
        # a two-character ASCII stop string, first found as late as possible: after replaced bytes
        at = max(i for i in range(len(want) - 1)
                 if want[i:i + 2].isascii() and want[i:i + 2].strip() and want.find(want[i:i + 2]) == i)
        assert "\ufffd" in want[:at]
        stop = want[at:at + 2]
        assert _completion_texts(llm, "Hello", max_tokens=64, temperature=0.0, stop=[stop]) == [want[:at]] * 3


@pytest.mark.parametrize("stop", [None, "cd", "\u2713x"])
def test_completion_utf8_split_across_tokens(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                             stop: str | None) -> None:
    """Characters whose bytes come in several tokens, invalid bytes and an incomplete last character."""
    vocab = synth.vocabulary(synth.SHAPES["tiny"].n_vocab)[0]

    def byte_tokens(data: bytes) -> list[int]:
        return [vocab.index(f"<0x{b:02X}>") for b in data]

    with Llama(tiny_model, n_ctx=256) as llm:
        tokens = (llm.tokenize("ab", add_bos=False) + byte_tokens("é".encode()) + byte_tokens(b"\xff")
                  + llm.tokenize("✓x", add_bos=False)  # byte fallback: one token a byte
                  + byte_tokens("漢".encode()[:2]) + llm.tokenize("cd", add_bos=False) + byte_tokens(b"\x80\xe2\x82"))
        assert len(tokens) > len("ab✓xcd") + 6  # multi-byte characters are split across tokens

        def fake_steps(*args: object, **kw: object) -> Iterator[tuple[int, None]]:  # the generation loop
            for t in tokens:
                yield t, None

        monkeypatch.setattr(llm, "_steps", fake_steps)
        want = llm.detokenize(tokens).decode("utf-8", "replace")
        assert want.count("\ufffd") == 4 and want.startswith("abé\ufffd✓x")
        if stop is not None:
            want = want[: want.find(stop)]
        assert _completion_texts(llm, "abc", max_tokens=len(tokens), stop=stop) == [want] * 3


# a child Python: stderr is its fd 2, which llama.cpp's log writes to
QUIET_LOAD = """
import sys
from pyllama_so import Llama, ModelLoadError
try:
    with Llama(sys.argv[1], n_ctx=512, n_threads=2) as llm:
        llm.create_completion("Hello", max_tokens=2, temperature=0)
        print("generated")
except ModelLoadError as e:
    print(e)
"""


def _quiet_load(path: Path) -> tuple[str, str]:
    res = subprocess.run([sys.executable, "-c", QUIET_LOAD, str(path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip(), res.stderr


def test_verbose_false_is_silent_on_a_gemma3_load(gemma3_model: Path) -> None:
    """Gemma 3's load logs warnings (a control-looking token, the full-size SWA cache): with verbose=False
    (the default) none of llama.cpp's log reaches stderr while it loads and generates, as with
    llama-cpp-python."""
    out, err = _quiet_load(gemma3_model)
    assert (out, err) == ("generated", "")


def test_a_load_error_is_in_the_exception_only(tmp_path: Path, tiny_model: Path) -> None:
    """llama.cpp's error lines are the exception's text, not printed before it."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:100_000])
    out, err = _quiet_load(cut)
    assert "data is not within the file bounds" in out and err == ""


def test_explicit_log_level_survives_verbose(tiny_model: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A level set with set_log_level stays: verbose=False does not reset it, verbose=True only lowers it
    to info; set_log_level(None) gives verbose= the say again."""
    info, debug = "llama_model_loader:", "assigned to device"  # lines llama.cpp logs at these levels on load
    try:
        pyllama_so.set_log_level("info")
        Llama(tiny_model, n_ctx=256, verbose=False).close()
        err = capfd.readouterr().err
        assert info in err and debug not in err
        pyllama_so.set_log_level("debug")
        Llama(tiny_model, n_ctx=256, verbose=True).close()
        assert debug in capfd.readouterr().err
        pyllama_so.set_log_level("error")
        Llama(tiny_model, n_ctx=256, verbose=True).close()
        err = capfd.readouterr().err
        assert info in err and debug not in err
        pyllama_so.set_log_level(None)
        Llama(tiny_model, n_ctx=256, verbose=False).close()
        assert info not in capfd.readouterr().err
    finally:
        pyllama_so.set_log_level(None)
    with pytest.raises(ValueError, match="log level"):
        pyllama_so.set_log_level("loud")


def test_misspelled_keyword_leaves_nothing_for_del(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """__init__ never runs, so close() (through __del__) finds the class defaults: no "Exception ignored"."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(TypeError, match="n_seq_max"):
        Llama(tiny_model, n_seq_max=2)  # type: ignore[call-arg]
    gc.collect()
    assert unraisable == []


def test_n_ctx_rounded_up_is_a_warning(tiny_model: Path) -> None:
    with pytest.warns(UserWarning, match="n_ctx=64 became 256"):
        llm = Llama(tiny_model, n_ctx=64)
    with llm:
        assert llm.n_ctx() == 256
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Llama(tiny_model, n_ctx=512).close()  # a multiple of 256 is kept
        Llama(tiny_model, n_ctx=0).close()  # the training context


def test_decode_sequences_batches_two_prompts(tiny_model) -> None:
    from pyllama_so import _llama

    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    a = [int(t) for t in np.random.default_rng(1).integers(1, 400, 150)]
    b = [int(t) for t in np.random.default_rng(2).integers(1, 400, 90)]
    try:
        ctx = _llama.Context(model, n_ctx=1024, n_batch=128, n_ubatch=64, n_seq_max=2)
        both = ctx.decode_sequences([(1, b), (0, a)])  # 240 tokens: two llama_decode calls, mixed sequences
        assert ctx.n_past(0) == 150 and ctx.n_past(1) == 90
        alone = []
        for toks in (b, a):
            ctx.clear()
            alone.append(ctx.decode(toks)[-1])
        ctx.free()
        # other batch shapes round differently (F16 weights and cache): close, and each row is its own sequence's
        np.testing.assert_allclose(both, np.stack(alone), atol=5e-3)
        assert np.abs(both[0] - alone[1]).max() > 50 * np.abs(both[0] - alone[0]).max()
        with pytest.raises(ValueError):
            ctx2 = _llama.Context(model, n_ctx=256, n_seq_max=2)
            try:
                ctx2.decode_sequences([(0, a[:4]), (0, b[:4])])  # the same sequence twice
            finally:
                ctx2.free()
    finally:
        model.free()


def test_decode_batch_logits_only_where_asked(tiny_model) -> None:
    """decode_batch: sequences continue after what they hold, only items that ask get a logits row, and each
    row is bitwise what the sequence alone gives; a sequence past its share of the context is refused first."""
    from pyllama_so import _llama

    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    rng = np.random.default_rng(3)
    a, b, c = (rng.integers(1, 500, n).tolist() for n in (40, 25, 9))
    try:
        ctx = _llama.Context(model, n_ctx=1024, n_batch=128, n_ubatch=32, n_seq_max=4)
        assert (ctx.n_seq_max, ctx.n_ctx_seq) == (4, 256)
        first = ctx.decode_batch([(0, a, True), (2, b, False)])
        assert first.shape == (1, 512) and (ctx.n_past(0), ctx.n_past(2)) == (40, 25)
        step = ctx.decode_batch([(2, c, True), (0, [7], True)])  # rows in the order of the items
        assert (ctx.n_past(0), ctx.n_past(2)) == (41, 34)
        with pytest.raises(_llama.ContextFullError, match="sequence 1"):
            ctx.decode_batch([(3, [5], True), (1, [1] * 257, True)])
        assert ctx.n_past(3) == 0  # refused before anything was decoded
        alone = _llama.Context(model, n_ctx=1024, n_batch=128, n_ubatch=32, n_seq_max=4)
        assert np.array_equal(alone.decode(a)[-1], first[0]) and np.array_equal(alone.decode([7])[-1], step[1])
        alone.clear()
        alone.decode(b)
        assert np.array_equal(alone.decode(c)[-1], step[0])
        alone.free()
        ctx.free()
    finally:
        model.free()


def test_chat_templates_are_llama_cpp_s() -> None:
    from pyllama_so import _llama

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert _llama.chat_apply_template("chatml", msgs) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _llama.chat_apply_template("chatml", msgs, add_assistant=False).endswith("Hi<|im_end|>\n")
    many = [{"role": "user", "content": ""}] * 30  # the formatting outgrows the first buffer: formatted again
    assert _llama.chat_apply_template("llama3", many).count("<|start_header_id|>user<|end_header_id|>") == 30
    assert {"chatml", "llama3", "mistral-v7"} <= set(_llama.chat_builtin_templates())
    # a model's Jinja text is recognized by its markers
    assert "<|im_start|>user" in _llama.chat_apply_template("{% for m in messages %}<|im_start|>{% endfor %}", msgs)
    with pytest.raises(ValueError, match="cannot format"):
        _llama.chat_apply_template("no such template", msgs)


def test_synthetic_model_has_no_chat_template(tiny_model: Path) -> None:
    from pyllama_so import _llama

    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    try:
        assert model.chat_template() is None and model.chat_template("tool_use") is None
    finally:
        model.free()

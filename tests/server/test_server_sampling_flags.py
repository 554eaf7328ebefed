"""llama-server's sampler flags in our server (--top-k, --repeat-penalty, -l, --ignore-eos, ...): parsed with its
names and variables, out-of-range values exit 2 naming the flag, flags for what the chain lacks say so, and a
request that leaves a field out gets the flag's value (in its answer and in /props)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pyllama_so import Llama
from pyllama_so.server.__main__ import main as server_main, parser as server_parser
from pyllama_so.server.sampling_flags import sampling_defaults
from server_process import ServerProcess  # scripts/server_process.py

ARGS = ["-t", "2", "-c", "512", "-np", "1"]


def defaults_of(argv: list[str]) -> dict:
    ap = server_parser()
    return sampling_defaults(ap, ap.parse_args(argv))


def test_flags_give_the_sampling_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    assert defaults_of([]) == {}
    got = defaults_of(["--top-k", "1", "--top-p", "0.5", "--min-p", "0", "--typical", "0.9", "--repeat-last-n", "32",
                       "--repeat-penalty", "1.1", "--presence-penalty", "0.2", "--frequency-penalty", "0.3",
                       "--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "4", "--top-n-sigma", "1.5",
                       "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--dry-multiplier", "0.8",
                       "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n", "128",
                       "--dry-sequence-breaker", "a", "--dry-sequence-breaker", "b", "-l", "15+1",
                       "--logit-bias", "20-inf"])
    assert got == {"top_k": 1, "top_p": 0.5, "min_p": 0.0, "typical_p": 0.9, "penalty_last_n": 32,
                   "repeat_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3, "mirostat_mode": 2,
                   "mirostat_eta": 0.2, "mirostat_tau": 4.0, "top_n_sigma": 1.5, "xtc_probability": 0.5,
                   "xtc_threshold": 0.2, "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
                   "dry_penalty_last_n": 128, "dry_sequence_breakers": ("a", "b"),
                   "logit_bias": {15: 1.0, 20: float("-inf")}}
    assert defaults_of(["--dry-sequence-breaker", "none"]) == {"dry_sequence_breakers": ()}
    monkeypatch.setenv("LLAMA_ARG_TOP_K", "3")
    monkeypatch.setenv("LLAMA_ARG_REPEAT_PENALTY", "1.2")
    assert defaults_of([]) == {"top_k": 3, "repeat_penalty": 1.2}
    assert defaults_of(["--top-k", "5"])["top_k"] == 5  # the flag wins over the variable
    assert server_parser().parse_args(["--ignore-eos"]).ignore_eos and not server_parser().parse_args([]).ignore_eos


@pytest.mark.parametrize(("argv", "says"), [
    (["--top-p", "2"], "argument --top-p: top_p"),
    (["--top-k", "-1"], "argument --top-k: top_k"),
    (["--repeat-penalty", "0"], "argument --repeat-penalty: repeat_penalty"),
    (["--mirostat", "3"], "argument --mirostat: mirostat_mode"),
    (["--top-k", "x"], "argument --top-k: invalid int value"),
    (["-l", "15*2"], "expected TOKEN_ID(+/-)BIAS"),
    (["-l", "15+nan"], "expected TOKEN_ID(+/-)BIAS"),
    (["--samplers", "top_k;temperature"], "argument --samplers: not supported by this server (a custom sampler order"),
    (["--dynatemp-range", "0.5"], "argument --dynatemp-range: not supported by this server (dynamic temperature)"),
])
def test_bad_sampler_flags_exit_2_naming_the_flag(argv: list[str], says: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        defaults_of(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_a_default_logit_bias_outside_the_vocabulary_stops_the_start(tiny_model: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main(["-m", str(tiny_model), *ARGS, "-l", "999999+1"]) == 1
    assert "999999" in capsys.readouterr().err


def test_requests_get_the_flags_where_they_leave_a_field_out(tiny_model: Path) -> None:
    """--top-k 1 with --temp 1: a request that gives neither samples greedily (Llama's greedy text); one that gives
    top_k 0 does not take the flag's. --ignore-eos shows in /props and in a native answer's settings, and a
    request's own "ignore_eos": false wins."""
    prompt = "The quick brown fox"
    with Llama(tiny_model, n_ctx=512, n_threads=2) as llm:
        greedy = llm.create_completion(prompt, max_tokens=12, temperature=0.0)["choices"][0]["text"]
    with ServerProcess(["-m", str(tiny_model), *ARGS, "--top-k", "1", "--temp", "1", "--seed", "3",
                        "--repeat-penalty", "1.0", "--ignore-eos"]) as s:
        props = httpx.get(f"{s.url}/props").json()["default_generation_settings"]["params"]
        assert (props["top_k"], props["temperature"], props["seed"], props["ignore_eos"]) == (1, 1.0, 3, True)
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": prompt, "max_tokens": 12}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == greedy
        texts = {httpx.post(f"{s.url}/v1/completions", json={"prompt": prompt, "max_tokens": 12, "top_k": 0, "seed": k},
                            timeout=60).json()["choices"][0]["text"] for k in range(4)}
        assert texts != {greedy}  # temperature 1 over the whole vocabulary: not the greedy text every time
        native = httpx.post(f"{s.url}/completion", json={"prompt": prompt, "n_predict": 2}, timeout=60).json()
        assert native["generation_settings"]["ignore_eos"] is True and native["generation_settings"]["top_k"] == 1
        own = httpx.post(f"{s.url}/completion", json={"prompt": prompt, "n_predict": 2, "ignore_eos": False},
                         timeout=60).json()
        assert own["generation_settings"]["ignore_eos"] is False

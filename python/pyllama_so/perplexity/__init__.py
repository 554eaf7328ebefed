"""Perplexity and KL divergence of a model on a text, as llama.cpp's llama-perplexity computes them.

    python -m pyllama_so.perplexity -m model.gguf -c 512
    python -m pyllama_so.perplexity -m model.gguf -c 512 --kl-divergence-base base.npz
    python -m pyllama_so.perplexity -m model.gguf -sm tensor -so 1 --kl-divergence-base base.npz --kl-divergence

The text (-f) is cut into chunks of -c tokens; each chunk is evaluated from an empty KV cache with its first
token replaced by BOS (when the model adds one), and the second half of its tokens is scored, each from the
logits of the position before it. `--kl-divergence-base FILE` saves the base's distributions of those
positions (base_file.py has the format); with `--kl-divergence` the tokens come from that file and the run
reports the KL divergence of its distributions from the base's, the share of positions whose most probable
token agrees, and the ratio of the perplexities. Without -f the text is the one bundled with the package:
Lewis Carroll's *Alice's Adventures in Wonderland* (public domain), see TEXT.
"""

from pyllama_so.perplexity.run import TEXT, Settings, Summary, run

__all__ = ["TEXT", "Settings", "Summary", "run"]

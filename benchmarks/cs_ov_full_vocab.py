"""The copy-suppression OV criterion on SmolLM2 over its whole vocabulary, written out from the raw weights in
float64 (tests/helpers/llama_ov.py: W_EE with layer 0's attention locked on the token, then one head's W_OV and the
unembedding): for every token, how many of the 49,152 logits of its column lie below its own, and the share of
tokens whose own logit is among the BOTTOM_K lowest. This is the independent computation behind the figures that
tests/test_cs_ov_vocab.py::PEER holds; it uses no headlens score code.

    python benchmarks/cs_ov_full_vocab.py --layers 23 24 [--chunk 256]

Prints one line per head (layer.head share) and a JSON document of every share. Minutes of float64 products on
2 cores (figures in BENCHMARKS.md, "Copy suppression").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.helpers

from headlens.scores.ov_vocab import BOTTOM_K  # noqa: E402  (the criterion's rank: McDougall et al.'s 10)
from tests.helpers.llama_ov import load_smollm2, manual_below  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[23, 24])
    parser.add_argument("--chunk", type=int, default=256, help="tokens per float64 pass")
    args = parser.parse_args()
    loaded = load_smollm2()
    model, n_vocab = loaded.model, loaded.spec.d_vocab
    shares = {}
    with torch.no_grad():
        for layer in args.layers:
            for head in range(loaded.spec.n_heads):
                hits = 0
                for start in range(0, n_vocab, args.chunk):
                    tokens = torch.arange(start, min(start + args.chunk, n_vocab))  # [chunk]
                    hits += int((manual_below(model, tokens, layer, head) < BOTTOM_K).sum())
                shares[f"{layer}.{head}"] = hits / n_vocab
                print(f"{layer}.{head} {hits / n_vocab:.3f}", flush=True)
    print(json.dumps(shares, indent=1))


if __name__ == "__main__":
    main()

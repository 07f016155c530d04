"""Loading a named GGUF model (`headlens pull NAME` first): decoding every tensor with gguf's numpy
`dequantize` vs headlens.load.dequant's torch decoder, side by side; then headlens's first load (convert
into an empty cache) and second load (from the cache); with --peer, transformers' own
`from_pretrained(gguf_file=...)` (numpy decoding, gguf.GGUFReader) as well.

    .venv/bin/python benchmarks/bench_load.py smollm2 gemma3-270m [--peer] [--threads 2]

Imports (torch, transformers) are warmed before timing, so the figures are load work, not Python
start-up. Prints one row per measurement and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import gguf
import numpy as np
import torch

from headlens.errors import UnsupportedModelError
from headlens.load.dequant import dequantize
from headlens.load.gguf_read import read_gguf
from headlens.load.models import load_model, resolve_model
from headlens.load.pulls import NAMED_MODELS, named_gguf


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def decode_all(path, numpy_reference: bool) -> float:
    """Seconds to decode every tensor of the file (header parse excluded)."""
    tensors = read_gguf(path).tensors
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as headlens.load.gguf_load runs the decoder
    start = time.perf_counter()
    for tensor in tensors:
        if numpy_reference:
            gguf.quants.dequantize(np.array(tensor.data), gguf.GGMLQuantizationType(tensor.ggml_type))
        else:
            dequantize(tensor.data, tensor.ggml_type)
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads)
    return seconds


def headlens_loads(name: str, path) -> tuple[float, float]:
    """(first load into an empty cache, second load from it), seconds; `path`: the pulled GGUF,
    linked into the empty cache so nothing is downloaded."""
    before = os.environ.get("HEADLENS_CACHE")
    with tempfile.TemporaryDirectory(prefix="headlens-bench-cache-") as cache:
        os.environ["HEADLENS_CACHE"] = cache
        try:
            os.makedirs(os.path.join(cache, "gguf", name))
            os.symlink(path, os.path.join(cache, "gguf", name, NAMED_MODELS[name].file))
            first, _ = timed(lambda: load(name))
            second, _ = timed(lambda: load(name))
        finally:
            os.environ.pop("HEADLENS_CACHE")
            if before is not None:
                os.environ["HEADLENS_CACHE"] = before
    return first, second


def load(name: str):
    """headlens.load.models.load_model; for a family without a headlens adapter yet (gemma3_text), the same
    steps without the adapter: resolve (convert on first use), from_pretrained, tokenizer."""
    try:
        return load_model(name)
    except UnsupportedModelError:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, _, _ = resolve_model(name)
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32), AutoTokenizer.from_pretrained(
            str(folder)
        )


def peer_load(path) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load():
        AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    return timed(load)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(NAMED_MODELS))
    parser.add_argument("--peer", action="store_true", help="also time transformers' own GGUF loading")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers  # noqa: F401  (warm the imports)

    print(f"torch threads {args.threads}; load average before: {os.getloadavg()}")
    for name in args.names:
        path = named_gguf(name)
        numpy_s, torch_s = decode_all(path, True), decode_all(path, False)
        print(
            f"{name}: decode every tensor: gguf numpy {numpy_s:.1f} s, headlens torch {torch_s:.1f} s "
            f"({numpy_s / torch_s:.1f}x)"
        )
        first, second = headlens_loads(name, path)
        print(f"{name}: headlens first load (convert + cache) {first:.1f} s, second load (cache) {second:.1f} s")
        if args.peer:
            print(f"{name}: transformers from_pretrained(gguf_file=...) + tokenizer {peer_load(path):.1f} s")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

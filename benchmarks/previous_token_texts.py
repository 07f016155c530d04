"""Why do a model's previous-token heads flip on another text? The natural-text probe alone (no needles,
no vocabulary criteria) on each text, and the same argmax share on random tokens, for the watched heads:
offset, positional share with its 95% bootstrap interval over the text windows, the share of bootstrap
resamples keeping share >= the cut-off at offset -1, prev_token_score, and the share of the text's
queries whose previous token repeats one seen within the last 8 (repeated words, numbered sections).

    .venv/bin/python benchmarks/previous_token_texts.py smollm2 --watch 17.8,19.3,19.8 \
        --text /usr/share/common-licenses/GPL-3
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from headlens.classify import ClassifyConfig, stability
from headlens.classify.compare import shipped_documents
from headlens.classify.runs import SOURCE_GIVEN, ProbeRun, probe_sizes, score_text
from headlens.load.models import load_model
from headlens.probes.inputs import random_token_range, read_text, repeated_random_tokens

CUT = ClassifyConfig().positional_min


def probe(loaded, config, text: str, heads) -> dict:
    run = ProbeRun(loaded, config, [text], SOURCE_GIVEN, probe_sizes(loaded.spec.n_ctx, config))
    result = score_text(run)
    units = stability.Units(argmax=result.units.argmax)
    counts = stability.draws(config.seed, 0, units.n_units, stability.N_RESAMPLES)
    samples = stability._resampled(units, counts, np.random.default_rng(0))
    share, offset = samples["positional_share"], samples["positional_offset"]  # [resample, layer, head]
    out = {}
    for layer, head in heads:
        low, high = np.percentile(share[:, layer, head], [2.5, 97.5])
        out[f"{layer}.{head}"] = {
            "offset": int(result.scores["positional_offset"][layer, head]),
            "share": round(float(result.scores["positional_share"][layer, head]), 4),
            "share_ci": [round(float(low), 4), round(float(high), 4)],
            "previous_token_stability": float(np.mean((share[:, layer, head] >= CUT) & (offset[:, layer, head] == -1))),
            "prev_token_score": round(float(result.scores["prev_token_score"][layer, head]), 4),
        }
    return out


def repeats_nearby(loaded, text: str, back: int = 8) -> float:
    """Share of tokens equal to one of the `back` tokens before them."""
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"][:4096]
    hits = sum(ids[i] in ids[max(0, i - back) : i] for i in range(1, len(ids)))
    return round(hits / max(1, len(ids) - 1), 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--watch", required=True)
    parser.add_argument("--text", nargs="*", default=[])
    args = parser.parse_args()
    heads = [tuple(map(int, h.split("."))) for h in args.watch.split(",")]
    loaded, config = load_model(args.model), ClassifyConfig()
    texts = {"english": shipped_documents()["english"]}
    texts.update({path.rsplit("/", 1)[-1]: read_text(path) for path in args.text})
    low, high = random_token_range(loaded.spec.d_vocab, None, None)
    ids = repeated_random_tokens(16, 255, 1, low, high, None, seed=0).tolist()  # [16, 255]: no repeats
    texts["random_tokens"] = ids
    out = {"model": args.model, "cut_off": CUT}
    for name, text in texts.items():
        start = time.perf_counter()
        documents = text if name == "random_tokens" else text
        out[name] = (
            probe_ids(loaded, config, documents, heads)
            if name == "random_tokens"
            else probe(loaded, config, text, heads)
        )
        out[name]["seconds"] = round(time.perf_counter() - start, 1)
        if name != "random_tokens":
            out[name]["repeats_within_8"] = repeats_nearby(loaded, text)
        print(json.dumps({name: out[name]}), flush=True)


def probe_ids(loaded, config, sequences, heads) -> dict:
    """The same probe on token sequences (random ids): decoded to text would re-tokenise differently, so the
    sequences are scored as windows directly."""
    from headlens.capture import iter_batches, run_capture
    from headlens.scores.positional import ArgmaxOffsetReducer, prev_token_reducer

    bos = loaded.bos_token_id
    windows = [([bos] if bos is not None else []) + list(seq) for seq in sequences]
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    argmax, prev = ArgmaxOffsetReducer(n, h, config.max_offset), prev_token_reducer(n, h)
    run_capture(loaded.model, iter_batches(windows, config.batch_size), [argmax, prev])
    offset, share = argmax.result()
    score = prev.result()
    return {
        f"{layer}.{head}": {
            "offset": int(offset[layer, head]),
            "share": round(float(share[layer, head]), 4),
            "prev_token_score": round(float(score[layer, head]), 4),
        }
        for layer, head in heads
    }


if __name__ == "__main__":
    main()

"""Hand-made report inputs (a 2-layer x 3-head model's frames, viewer data, a training log) shared by the report
tests, and the word splitter the i18n checks compare prose with."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headlens.classify.samples import sample_result
from headlens.results import Result

N_LAYERS, N_HEADS, POS = 2, 3, 5
MODEL_INFO = {
    "name": "hand-made",
    "n_layers": N_LAYERS,
    "n_heads": N_HEADS,
    "d_head": 16,
    "d_model": 48,
    "n_ctx": 64,
    "n_params": 123456,
}


def heads_frame() -> pd.DataFrame:
    rows = []
    for layer in range(N_LAYERS):
        for head in range(N_HEADS):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "labels": ["previous_token"] if (layer, head) == (0, 1) else [],
                    "prev_token_score": 0.9 if (layer, head) == (0, 1) else 0.1 * head,
                    "first_token_score": 0.2 + 0.1 * layer,
                    "positional_offset": -1,
                    "positional_share": 0.5,
                    "copying_score": -0.5 + 0.2 * head,
                    "n_positions": 40,
                }
            )
    return pd.DataFrame(rows)


def viewer_dict(tokens=None) -> Result:
    tokens = tokens or ["<|endoftext|>", "The", " cat", " sat", "."]
    pos = len(tokens)
    causal = np.tril(np.ones((pos, pos)))  # [q_pos, k_pos]
    uniform = causal / causal.sum(-1, keepdims=True)  # [q_pos, k_pos], rows sum to 1
    patterns = np.broadcast_to(uniform, (N_LAYERS, N_HEADS, pos, pos)).copy()  # [layer, head, q, k]
    patterns[0, 1] = np.eye(pos, k=-1)  # a perfect previous-token head
    patterns[0, 1, 0, 0] = 1.0
    return sample_result(tokens, patterns, n_tokens_total=pos + 10, text="The cat sat.")


def sweep_frame() -> pd.DataFrame:
    deltas = np.linspace(-0.05, 0.3, N_LAYERS * N_HEADS)
    return pd.DataFrame(
        [
            {
                "layer": i // N_HEADS,
                "head": i % N_HEADS,
                "n_tokens": 200,
                "loss": 3.0,
                "loss_ablated": 3.0 + d,
                "delta_loss": d,
                "ci95_low": d - 0.01,
                "ci95_high": d + 0.01,
            }
            for i, d in enumerate(deltas)
        ]
    )


def validation_frame(fail_layer=None) -> pd.DataFrame:
    rows = [
        {
            "layer": layer,
            "quantity": q,
            "reference": "hf_eager",
            "max_abs_error": 1e-7 if layer != fail_layer else 0.1,
            "tolerance": 1e-5,
            "passed": layer != fail_layer,
        }
        for layer in range(N_LAYERS)
        for q in ("pattern", "z")
    ]
    return pd.DataFrame(rows)


def training_pair(jump_step=300) -> Result:
    steps = np.arange(0, 600, 100)
    log = pd.DataFrame(
        {
            "step": steps,
            "tokens_seen": steps * 1000,
            "train_loss": 4 - steps / 1000,
            "heldout_loss": 4.1 - steps / 1000,
            "icl_score": np.where(steps >= jump_step, -0.4, -0.1),
            "best_induction_score": np.where(steps >= jump_step, 0.6, 0.05),
            "best_prev_token_score": 0.9,
            "repeat_loss_first": 5.0,
            "repeat_loss_second": np.where(steps >= jump_step, 1.0, 5.0),
        }
    )
    heads = pd.DataFrame(
        [
            {"step": s, "layer": 1, "head": h, "prev_token_score": 0.1, "prefix_matching_score": 0.2}
            for s in steps
            for h in range(N_HEADS)
        ]
    )
    return Result("training", log, {"folder": None}, tables={"heads": heads})


def words(text: str) -> set[str]:
    """Lower-case words of prose; names with an underscore (previous_token, n_seq) are identifiers."""
    return {word for word in re.findall(r"[a-z_']+", text.lower()) if "_" not in word and len(word) > 1}

"""What every checkpoint of a training run measures, with the library's scorers.

The same code serves every architecture a recipe trains (GPT-2 and Llama with grouped-query attention
alike): the head scores stream through headlens.capture's reducers, as `classify` runs them.
- held-out loss, the ICL score (Olsson et al. 2022) and each head's previous-token score
  (mean A[i, i-1], TransformerLens; headlens.scores.positional) on held-out text windows;
- each head's second-copy induction score and the first / second copy losses on [BOS, c, c]
  (headlens.scores.icl);
- each head's induction score on the TransformerLens / ARENA probe: BOS + 50 random tokens +
  the same 50, mean of `pattern.diagonal(offset=1 - 50)`: the attention on the key 49 back;
- needle-in-a-haystack tests retrieved by greedy decoding (`headlens.probes.inputs.needle_prompts`,
  the probe `classify` runs) and each head's retrieval score (Wu et al. 2024, arXiv 2404.15574;
  headlens.scores.retrieval).
"""

from __future__ import annotations

import torch

from headlens.capture import iter_batches, run_capture
from headlens.probes.inputs import default_text, needle_prompts, needle_size, repeated_random_tokens, text_windows
from headlens.probes.tokenize import encode
from headlens.scores.common import TargetMassReducer
from headlens.scores.icl import copy_losses, icl_score, second_copy_induction_reducer
from headlens.scores.positional import offset_mass, offset_targets, prev_token_reducer
from headlens.scores.retrieval import retrieval_scores
from headlens.training.config import TrainConfig
from headlens.training.data import PRINTABLE

ARENA_SEQ_LEN = 50  # TransformerLens main demo / ARENA: 50 random tokens, repeated once
NEEDLE_LEN, NEEDLE_RESTATE, NEEDLE_SEED = 16, 4, 0  # `classify`'s needle probe defaults
EVAL_BATCH = 16  # sequences per forward pass


def build_probes(tokenizer, config: TrainConfig) -> dict:
    """Fixed evaluation inputs: held-out windows, [BOS, c, c], the ARENA probe and needle tests."""
    bos = tokenizer.bos_token_id
    text = default_text()
    windows = text_windows(tokenizer, text, config.n_ctx, bos, max_windows=config.eval_windows)
    windows = torch.tensor([w for w in windows if len(w) == config.n_ctx])  # [n_windows, n_ctx]
    repeat = repeated_random_tokens(
        config.probe_seqs, config.probe_seq_len, 2, *PRINTABLE, bos, seed=config.probe_seed
    )  # [n_seq, 1 + 2 * len]
    arena = repeated_random_tokens(
        config.probe_seqs, arena_len(config), 2, *PRINTABLE, bos, seed=config.probe_seed
    )  # [n_seq, 1 + 2 * 50]
    hay = encode(tokenizer, text)
    needle_len, restate = needle_size(config.n_ctx, NEEDLE_LEN, NEEDLE_RESTATE)
    needles = needle_prompts(
        hay, config.n_ctx, bos, PRINTABLE, needle_len=needle_len, restate=restate, seed=NEEDLE_SEED
    )
    return {"windows": windows, "repeat": repeat, "arena": arena, "needles": needles}


def arena_len(config: TrainConfig) -> int:
    """ARENA's 50 random tokens, fewer when two copies and BOS would not fit the context."""
    return min(ARENA_SEQ_LEN, (config.n_ctx - 1) // 2)


def token_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """Next-token losses [n, pos - 1] of full-length ids [n, pos] (index t = loss of token t + 1)."""
    losses = []
    with torch.no_grad():
        for batch in ids.split(EVAL_BATCH):
            logits = model(input_ids=batch).logits[:, :-1].float()  # [batch, pos - 1, d_vocab]
            losses.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none"))
    return torch.cat(losses)  # [n, pos - 1]


def arena_induction_reducer(n_layers: int, n_heads: int, seq_len: int) -> TargetMassReducer:
    """ARENA's induction score as a reducer: mean over queries q >= seq_len - 1 of A[q, q + 1 - seq_len],
    the mean of `pattern.diagonal(offset=1 - seq_len)` over sequences and queries."""
    offset = 1 - seq_len
    return TargetMassReducer(
        n_layers,
        n_heads,
        lambda b: offset_targets(b.input_ids, offset),
        mass_fn=lambda pattern, q_start: offset_mass(pattern, offset, q_start),
    )


def head_scores(model, probes: dict, config: TrainConfig) -> dict[str, torch.Tensor]:
    """Previous-token, second-copy induction and ARENA induction scores, [n_layers, n_heads] each."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    prev = prev_token_reducer(n_layers, n_heads)
    induction = second_copy_induction_reducer(n_layers, n_heads, config.probe_seq_len)
    arena = arena_induction_reducer(n_layers, n_heads, arena_len(config))
    for ids, reducer in ((probes["windows"], prev), (probes["repeat"], induction), (probes["arena"], arena)):
        run_capture(model, iter_batches(ids, EVAL_BATCH), [reducer])
    return {"prev": prev.result(), "induction": induction.result(), "arena": arena.result()}


def evaluate(model, probes: dict, config: TrainConfig) -> tuple[dict, list[dict]]:
    """One log row (losses, ICL score, best head scores, needles retrieved) and one row per head."""
    model.eval()
    text_losses = token_losses(model, probes["windows"])  # [n, n_ctx - 1]
    first, second = copy_losses(token_losses(model, probes["repeat"]), config.probe_seq_len)
    scores = head_scores(model, probes, config)  # [n_layers, n_heads] each
    prev, induction, arena = scores["prev"], scores["induction"], scores["arena"]
    needles = retrieval_scores(model, probes["needles"])
    # No test retrieved: no head copy-pastes a retrieved needle, logged as 0 (the library's score is NaN).
    retrieval = needles["score"].nan_to_num(0.0)  # [n_layers, n_heads]
    row = {
        "heldout_loss": float(text_losses.double().mean()),
        "icl_score": icl_score(text_losses, config.n_ctx),
        "best_induction_score": float(induction.max()),
        "best_prev_token_score": float(prev.max()),
        "repeat_loss_first": first,
        "repeat_loss_second": second,
        "best_arena_induction_score": float(arena.max()),
        "needles_retrieved": needles["n_retrieved"],
        "best_retrieval_score": float(retrieval.max()),
    }
    n_layers, n_heads = prev.shape
    heads = [
        {
            "layer": layer,
            "head": head,
            "prev_token_score": float(prev[layer, head]),
            "prefix_matching_score": float(induction[layer, head]),
            "arena_induction_score": float(arena[layer, head]),
            "retrieval_score": float(retrieval[layer, head]),
        }
        for layer in range(n_layers)
        for head in range(n_heads)
    ]
    return row, heads

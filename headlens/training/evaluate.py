"""What every checkpoint of a training run measures, from Hugging Face eager attention alone.

The model's own `output_attentions=True` patterns and plain arithmetic, so the same code serves
every architecture a recipe trains (GPT-2 and Llama with grouped-query attention alike):
- held-out loss, the ICL score (Olsson et al. 2022) and each head's previous-token score
  (mean A[i, i-1], TransformerLens) on held-out text windows;
- each head's second-copy induction score and the first / second copy losses on [BOS, c, c];
- each head's induction score on the TransformerLens / ARENA probe: BOS + 50 random tokens +
  the same 50, mean of `pattern.diagonal(offset=1 - 50)`;
- needle-in-a-haystack tests retrieved by greedy decoding (`headlens.probes.needle_prompts`,
  the probe `classify` runs) and each head's retrieval score (Wu et al. 2024, arXiv 2404.15574).
"""

from __future__ import annotations

import torch

from headlens.probes import default_text, needle_prompts, repeated_random_tokens, text_windows
from headlens.scores.icl import copy_losses, icl_score
from headlens.scores.induction import prefix_matching_targets
from headlens.training.config import TrainConfig
from headlens.training.data import PRINTABLE

ARENA_SEQ_LEN = 50  # TransformerLens main demo / ARENA: 50 random tokens, repeated once
NEEDLE_LEN, NEEDLE_RESTATE, NEEDLE_SEED = 16, 4, 0  # `classify`'s needle probe defaults
RETRIEVED_RECALL = 0.5  # Wu et al.: a test counts when > 50% of the needle is retrieved
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
    hay = tokenizer(text, add_special_tokens=False)["input_ids"]
    needles = needle_prompts(
        hay,
        config.n_ctx,
        bos,
        PRINTABLE,
        needle_len=min(NEEDLE_LEN, config.n_ctx // 8),
        restate=NEEDLE_RESTATE,
        seed=NEEDLE_SEED,
    )
    return {"windows": windows, "repeat": repeat, "arena": arena, "needles": needles}


def arena_len(config: TrainConfig) -> int:
    """ARENA's 50 random tokens, fewer when two copies and BOS would not fit the context."""
    return min(ARENA_SEQ_LEN, (config.n_ctx - 1) // 2)


def run_eager(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token losses [n, pos - 1] and patterns [n_layers, n, head, q_pos, k_pos] of ids [n, pos]."""
    losses, patterns = [], []
    with torch.no_grad():
        for batch in ids.split(EVAL_BATCH):
            out = model(input_ids=batch, output_attentions=True)
            logits = out.logits[:, :-1].float()  # [batch, pos - 1, d_vocab]
            losses.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none"))
            patterns.append(torch.stack(out.attentions))  # [n_layers, batch, head, q_pos, k_pos]
    return torch.cat(losses), torch.cat(patterns, dim=1)


def prev_token_scores(patterns: torch.Tensor) -> torch.Tensor:
    """Mean A[i, i-1] over queries i >= 1: [n_layers, n_heads] from [n_layers, n, head, q, k]."""
    return patterns.diagonal(offset=-1, dim1=-2, dim2=-1).double().mean((1, 3)).float()  # [n_layers, n_heads]


def second_copy_induction_scores(patterns: torch.Tensor, ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Mean mass on prefix-matching targets over second-copy queries of [BOS, c, c]: [n_layers, n_heads]."""
    targets = prefix_matching_targets(ids)  # [n, q_pos, k_pos]
    scored = targets.any(-1)  # [n, q_pos]
    scored[:, : 1 + seq_len] = False
    mass = (patterns * targets[None, :, None]).sum(-1).double()  # [n_layers, n, head, q_pos]
    return (mass * scored[None, :, None]).sum((1, 3)).div(scored.sum()).float()  # [n_layers, n_heads]


def arena_induction_scores(patterns: torch.Tensor, seq_len: int) -> torch.Tensor:
    """ARENA's induction score: mean of pattern.diagonal(offset=1 - seq_len): [n_layers, n_heads]."""
    stripe = patterns.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)  # [n_layers, n, head, seq_len + 2]
    return stripe.double().mean((1, 3)).float()  # [n_layers, n_heads]


def evaluate(model, probes: dict, config: TrainConfig) -> tuple[dict, list[dict]]:
    """One log row (losses, ICL score, best head scores, needles retrieved) and one row per head."""
    model.eval()
    text_losses, text_patterns = run_eager(model, probes["windows"])  # [n, n_ctx - 1], [L, n, H, q, k]
    rep_losses, rep_patterns = run_eager(model, probes["repeat"])
    _, arena_patterns = run_eager(model, probes["arena"])
    first, second = copy_losses(rep_losses, config.probe_seq_len)
    prev = prev_token_scores(text_patterns)  # [n_layers, n_heads]
    induction = second_copy_induction_scores(rep_patterns, probes["repeat"], config.probe_seq_len)
    arena = arena_induction_scores(arena_patterns, arena_len(config))  # [n_layers, n_heads]
    retrieved, retrieval = needle_retrieval(model, probes["needles"])  # int, [n_layers, n_heads]
    row = {
        "heldout_loss": float(text_losses.double().mean()),
        "icl_score": icl_score(text_losses, config.n_ctx),
        "best_induction_score": float(induction.max()),
        "best_prev_token_score": float(prev.max()),
        "repeat_loss_first": first,
        "repeat_loss_second": second,
        "best_arena_induction_score": float(arena.max()),
        "needles_retrieved": retrieved,
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


def needle_retrieval(model, tests) -> tuple[int, torch.Tensor]:
    """Greedy-decode every needle test; (tests retrieved, retrieval score [n_layers, n_heads]).

    Wu et al. 2024: at each generated token w, head h copy-pastes when w is a needle token and
    h's argmax key lies in the needle span and holds w. Score = copy-pastes / tokens asked for,
    averaged over the retrieved tests (0 where none is retrieved).
    """
    per_test = []
    with torch.no_grad():
        for test in tests:
            hits, correct = _decode_needle(model, test)  # [n_layers, n_heads], int
            asked = len(test.needle) - test.restate
            if correct / asked > RETRIEVED_RECALL:
                per_test.append(hits.double() / asked)
    if not per_test:
        n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
        return 0, torch.zeros(n_layers, n_heads)
    return len(per_test), torch.stack(per_test).mean(0).float()  # [n_layers, n_heads]


def _decode_needle(model, test) -> tuple[torch.Tensor, int]:
    """Copy-paste counts [n_layers, n_heads] and correct tokens of one greedy decoding."""
    ids = torch.tensor([test.prompt])  # [1, pos]
    needle = torch.tensor(test.needle)  # [needle_len]
    span = slice(test.needle_start, test.needle_start + len(test.needle))
    hits, correct = None, 0
    for step in range(len(test.needle) - test.restate):
        out = model(input_ids=ids, output_attentions=True)
        w = int(out.logits[0, -1].argmax())
        correct += int(w == test.needle[test.restate + step])
        keys = torch.stack(out.attentions)[:, 0, :, -1].argmax(-1)  # [n_layers, n_heads]
        inside = (keys >= span.start) & (keys < span.stop)  # [n_layers, n_heads]
        copied = inside & (ids[0][keys] == w) & bool((needle == w).any())  # [n_layers, n_heads]
        hits = copied.long() if hits is None else hits + copied.long()
        ids = torch.cat([ids, torch.tensor([[w]])], dim=1)  # [1, pos + 1]
    return hits, correct

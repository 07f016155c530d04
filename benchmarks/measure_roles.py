"""The head-role figures of a model card, measured from Hugging Face eager attention.

Run by hand: `.venv/bin/python benchmarks/measure_roles.py MODEL_DIR` (e.g. headlens/data/tiny).
Prints markdown for the card: per head the dominant argmax offset on held-out text and its share
(BOS column excluded, queries >= 2; Voita et al. 2019), the previous-token score (mean A[i, i-1]),
the ARENA induction score (BOS + 50 random printable bytes + the same 50, mean of
`pattern.diagonal(offset=1 - 50)`), the second-copy loss rise when the head alone is zero-ablated
(paired bootstrap 95% CI over sequences), and Wu et al.'s retrieval score on the needle probe;
then the needle tests retrieved and the model's losses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from headlens.files import shipped_path
from headlens.probes.inputs import needle_prompts, repeated_random_tokens
from headlens.scores.icl import icl_score
from headlens.training.data import PRINTABLE
from headlens.training.evaluate import EVAL_BATCH

# The eager-attention arithmetic (output_attentions=True, no headlens.capture or headlens.scores) is shared
# with its cross-check test (tests/test_training_evaluate.py), from the repository root's tests.helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.eager_roles import arena_induction_scores, needle_retrieval, prev_token_scores  # noqa: E402

ARENA_LEN, ARENA_SEQS, ARENA_SEED = 50, 64, 2024  # unseen in training (the log's probe uses seed 1234)
HELDOUT_WINDOWS = 128  # the first 128 full windows of heldout.txt (32,512 queries per head)
BOOTSTRAP = 2000


def heldout_windows(n_ctx: int, bos: int) -> torch.Tensor:
    raw = (shipped_path("tiny") / "heldout.txt").read_bytes()
    body = n_ctx - 1
    rows = [[bos, *raw[i : i + body]] for i in range(0, len(raw) - body, body)][:HELDOUT_WINDOWS]
    return torch.tensor(rows)  # [n, n_ctx]


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


def argmax_offsets(patterns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dominant offset and its share per head: ([L, H], [L, H]) from [L, n, H, q, k]."""
    q = patterns.shape[-2]
    keys = patterns[..., 2:, 1:].argmax(-1) + 1  # [L, n, H, q - 2]
    offsets = keys - torch.arange(2, q)  # [L, n, H, q - 2]: <= 0
    counts = torch.stack([(offsets == -k).double().mean((1, 3)) for k in range(q)])  # [q, L, H]
    share, best = counts.max(0)  # [L, H] each
    return -best, share


def second_copy_loss(model, ids: torch.Tensor, head=None) -> torch.Tensor:
    """Per-sequence mean loss on the second copy (first token left out), head zeroed if given: [n]."""
    handle = None
    if head is not None:
        layer, h = head
        d_head = model.config.hidden_size // model.config.num_attention_heads
        proj = (
            model.transformer.h[layer].attn.c_proj
            if model.config.model_type == "gpt2"
            else model.model.layers[layer].self_attn.o_proj
        )

        def zero(module, args):
            z = args[0].clone()  # [batch, pos, n_heads * d_head]
            z[..., h * d_head : (h + 1) * d_head] = 0
            return (z,)

        handle = proj.register_forward_pre_hook(zero)
    try:
        losses, _ = run_eager(model, ids)  # [n, pos - 1]
    finally:
        if handle is not None:
            handle.remove()
    return losses[:, ARENA_LEN + 1 :].double().mean(-1)  # [n]


def ablation_rise(model, ids: torch.Tensor, head) -> tuple[float, float, float]:
    clean = second_copy_loss(model, ids)
    diff = second_copy_loss(model, ids, head) - clean  # [n]
    gen = torch.Generator().manual_seed(0)
    means = diff[torch.randint(0, len(diff), (BOOTSTRAP, len(diff)), generator=gen)].mean(-1)
    return float(diff.mean()), float(means.quantile(0.025)), float(means.quantile(0.975))


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, attn_implementation="eager").eval()
    cfg, bos = model.config, model.config.bos_token_id
    windows = heldout_windows(cfg.max_position_embeddings, bos)
    text_losses, text_patterns = run_eager(model, windows)
    offset, share = argmax_offsets(text_patterns)
    prev = prev_token_scores(text_patterns)
    del text_patterns
    arena = repeated_random_tokens(ARENA_SEQS, ARENA_LEN, 2, *PRINTABLE, bos, seed=ARENA_SEED)  # [n, 101]
    arena_losses, arena_patterns = run_eager(model, arena)
    induction = arena_induction_scores(arena_patterns, ARENA_LEN)
    raw = (shipped_path("tiny") / "heldout.txt").read_bytes()
    tests = needle_prompts(list(raw), cfg.max_position_embeddings, bos, PRINTABLE, needle_len=16, restate=4, seed=0)
    retrieved, retrieval = needle_retrieval(model, tests)
    print(
        f"windows {len(windows)}; held-out loss {text_losses.double().mean():.3f}; "
        f"ICL {icl_score(text_losses, cfg.max_position_embeddings):.3f}; ARENA first/second copy loss "
        f"{arena_losses[:, 1:ARENA_LEN].double().mean():.3f} / {arena_losses[:, ARENA_LEN + 1 :].double().mean():.3f}"
    )
    print(f"needles_retrieved: {retrieved}/{len(tests)}")
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    group = cfg.num_attention_heads // n_kv
    for kv in range(n_kv):  # Hugging Face repeat_kv: query head h reads key/value head h // group
        print(f"kv_group_{kv}: " + ",".join(str(h) for h in range(kv * group, (kv + 1) * group)))
    print()
    print(
        "| head | argmax offset | share | prev_token_score | ARENA induction | delta second-copy loss, "
        "head ablated [95% CI] | retrieval_score |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    for layer in range(cfg.num_hidden_layers):
        for h in range(cfg.num_attention_heads):
            rise, low, high = ablation_rise(model, arena, (layer, h))
            print(
                f"| {layer}.{h} | {int(offset[layer, h])} | {share[layer, h]:.3f} | {prev[layer, h]:.3f} | "
                f"{induction[layer, h]:.3f} | {rise:+.3f} [{low:+.3f}, {high:+.3f}] | {retrieval[layer, h]:.3f} |"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Which heads of a real model write the IOI answer, and which carry it when ablated? One run.

Prints, on the IOI probe's 48 seeded prompts (headlens.scores.name_mover):
- the model's logit(IO) - logit(S) at END and the sum of every head's direct effect on it
  (headlens.scores.direct_logit; the rest is embeddings, MLPs and biases);
- the heads with the largest and smallest direct effects, with their END -> IO / S attention, name
  copy scores and labels;
- the direct-path version of the name-mover causal check: the labelled movers' summed direct effect
  against every set of the same per-layer counts from the other heads of those layers (at most 20);
- Wang et al.'s copy score in context: each head's OV circuit applied to the IO name's residual after
  block 0 at its position in each prompt (theirs), beside the effective-embedding score classify uses,
  for the heads that attend to IO;
- who makes up for the movers: the IOI run again with the labelled movers zero-ablated (and with the
  head of the largest direct effect ablated alone), the logit difference then, and the heads whose direct
  effects rise most (Wang et al. 2022's backup name movers);
- with --sweep FIRST: every head of layers FIRST.. zero-ablated alone on `logit-diff` (the total effect,
  headlens.ablation.ablate.sweep_heads), the heads that lower it most, beside their direct effects.

Run: .venv/bin/python -u benchmarks/ioi_direct_effects.py smollm2 --sweep 14
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from name_mover_ablation import disjoint_sets  # benchmarks/ is on sys.path when run as a script

from headlens.ablation.ablate import sweep_heads
from headlens.classify import classify_heads
from headlens.heads import Head
from headlens.intervene.replace import ablation_hooks
from headlens.load.models import load_model
from headlens.scores.name_mover import COPY_TOP_K, IO_ATTENTION_MIN, ablation_prompts, ioi_prompts, ioi_run
from headlens.scores.ov_circuit import own_ranks

N_CONTROL = 20
N_SHOWN = 8


def in_context_copy_scores(loaded, prompts: list[dict]) -> torch.Tensor:
    """Share of prompts whose IO name is in the top COPY_TOP_K of the head's OV output applied to the
    name's residual after block 0 at its position in the prompt (Wang et al. 2022): [layer, head]."""
    rows = []
    with torch.no_grad():
        for p in prompts:
            out = loaded.model(input_ids=torch.tensor([p["ids"]]), output_hidden_states=True)
            rows.append(out.hidden_states[1][0, p["io_pos"]])  # [d_model], after block 0
    above, _ = own_ranks(loaded.model, torch.tensor([p["io"] for p in prompts]), torch.stack(rows))
    return (above < COPY_TOP_K).double().mean(-1)  # [layer, head]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--sweep", type=int, default=None, metavar="FIRST", help="also sweep layers FIRST..")
    args = parser.parse_args()
    loaded = load_model(args.model)
    frame = classify_heads(loaded).frame.set_index(["layer", "head"])
    prompts = ioi_prompts(loaded.tokenizer, loaded.bos_token_id, 48, 0)
    run = ioi_run(loaded, prompts)
    effect = run["ioi_direct_effect"]  # [layer, head]
    print(f"logit diff {run['logit_diff']:.3f}; sum of the heads' direct effects {float(effect.sum()):.3f}")

    def describe(layer: int, head: int) -> str:
        row = frame.loc[(layer, head)]
        return (
            f"{layer}.{head}: direct {float(effect[layer, head]):+.3f}  END->IO {row.io_attention:.2f}  "
            f"END->S {row.s_attention:.2f}  copy {row.name_copy_score:.2f}  negative copy "
            f"{row.name_negative_copy_score:.2f}  labels {', '.join(row.labels) or '-'}"
        )

    order = sorted((float(effect[la, h]), la, h) for la in range(effect.shape[0]) for h in range(effect.shape[1]))
    print("largest direct effects:")
    for _, layer, head in order[::-1][:N_SHOWN]:
        print("  " + describe(layer, head))
    print("smallest direct effects:")
    for _, layer, head in order[:N_SHOWN]:
        print("  " + describe(layer, head))

    movers = [Head(la, h) for (la, h), labels in frame["labels"].items() if "name_mover" in labels]
    if movers:
        chosen = -sum(float(effect[h.layer, h.head]) for h in movers)  # removing their direct path
        sets = disjoint_sets(movers, loaded.spec.n_heads, k=sys.maxsize)  # every one
        if len(sets) > N_CONTROL:
            picks = torch.randperm(len(sets), generator=torch.Generator().manual_seed(0))[:N_CONTROL]
            sets = [sets[int(i)] for i in picks]
        controls = sorted(-sum(float(effect[h.layer, h.head]) for h in s) for s in sets)
        p = (1 + sum(c <= chosen for c in controls)) / (1 + len(controls))
        print(
            f"direct path of the movers {', '.join(map(str, movers))} removed: {chosen:+.3f} logits; "
            f"{len(controls)} same-layer sets: min {controls[0]:+.3f} median {controls[len(controls) // 2]:+.3f} "
            f"max {controls[-1]:+.3f}; p = {p:.2f}"
        )
    context_copy = in_context_copy_scores(loaded, prompts)  # [layer, head]
    io, s_att = run["io_attention"], run["s_attention"]  # [layer, head]
    attends = ((io >= IO_ATTENTION_MIN) & (io > s_att)).nonzero().tolist()
    print(f"heads attending to IO (>= {IO_ATTENTION_MIN}, above S): copy score by W_EE / in context:")
    for layer, head in attends:
        row = frame.loc[(layer, head)]
        print(
            f"  {layer}.{head}: {row.name_copy_score:.2f} / {float(context_copy[layer, head]):.2f}  "
            f"direct {float(effect[layer, head]):+.3f}"
        )
    top = Head(order[-1][1], order[-1][2])
    for off in ([movers] if movers else []) + [[top]]:
        with ablation_hooks(loaded.model, off):
            after = ioi_run(loaded, prompts)
        rise = after["ioi_direct_effect"] - effect  # [layer, head]
        rise[[h.layer for h in off], [h.head for h in off]] = float("nan")  # the ablated heads themselves
        ranked = sorted(
            ((float(rise[la, h]), la, h) for la in range(rise.shape[0]) for h in range(rise.shape[1])),
            key=lambda item: -item[0] if item[0] == item[0] else float("inf"),
        )
        names = ", ".join(map(str, off))
        print(
            f"{names} zero-ablated: logit diff {after['logit_diff']:.3f} (clean {run['logit_diff']:.3f}); "
            f"direct effects rising most: "
            + ", ".join(
                f"{la}.{h} {float(effect[la, h]):+.3f} -> {float(after['ioi_direct_effect'][la, h]):+.3f}"
                for _, la, h in ranked[:4]
            )
        )
    if args.sweep is not None:
        start = time.time()
        heads = [Head(la, h) for la in range(args.sweep, loaded.spec.n_layers) for h in range(loaded.spec.n_heads)]
        swept = sweep_heads(
            loaded, metric="logit-diff", prompts=ablation_prompts(prompts), heads=heads, batch_size=48
        ).frame
        print(f"single-head zero ablations of layers {args.sweep}.. ({time.time() - start:.0f} s); largest drops:")
        for row in swept.sort_values("delta").head(N_SHOWN).itertuples():
            print(f"  ablated delta {row.delta:+.3f}  " + describe(int(row.layer), int(row.head)))
        for head in movers:
            delta = float(swept[(swept["layer"] == head.layer) & (swept["head"] == head.head)]["delta"].iloc[0])
            direct = float(effect[head.layer, head.head])
            print(f"  labelled mover {head}: ablated delta {delta:+.3f}, direct effect {direct:+.3f}")


if __name__ == "__main__":
    main()

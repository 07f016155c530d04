"""The fast exact sweep equals the naive loop; durable rows; attribution patching vs autograd."""

from __future__ import annotations

import json

import pytest
import torch

from headlens.ablation.ablate import sweep_heads
from headlens.errors import ConfigError, InputTextError, OutputPathError
from headlens.heads import Head, all_heads
from headlens.intervene.evalset import EvalSet, repeat_evalset, text_evalset
from headlens.intervene.metrics import unembed_losses
from headlens.intervene.replace import replacements
from headlens.intervene.sums import ablated_sums, base_sums, sweep_sums
from tests.helpers.strong import sample_text

# The bar: every delta of the fast sweep within 1e-5 of the naive full-forward loop.
FAST_ATOL = 1e-5
# Attribution from our gate vs -sum(grad * z) from retain_grad on the same float32 model.
GRAD_RTOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def _naive_deltas(loaded, evalset, heads, reps):
    base = ablated_sums(loaded.model, evalset, [], reps)
    return {h: float((ablated_sums(loaded.model, evalset, [h], reps) - base).sum() / evalset.n_tokens) for h in heads}


def _fast_deltas(loaded, evalset, heads, reps, **kwargs):
    base = base_sums(loaded.model, evalset)
    found = {}
    sweep_sums(loaded.model, evalset, heads, reps, lambda h, s: found.update({h: s}), **kwargs)
    return {h: float((found[h] - base).sum() / evalset.n_tokens) for h in heads}


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_fast_sweep_equals_naive_loop_on_repeated_tokens(strong_model, method):
    evalset = repeat_evalset(strong_model, seed=1, n_seq=6, seq_len=12)
    reps = replacements(strong_model.model, evalset, method, seed=3, batch_size=4)
    heads = all_heads(strong_model.spec.n_layers, strong_model.spec.n_heads)
    naive = _naive_deltas(strong_model, evalset, heads, reps)
    fast = _fast_deltas(strong_model, evalset, heads, reps)
    assert max(abs(d) for d in naive.values()) > 1000 * FAST_ATOL  # non-trivial effects
    for head in heads:
        assert abs(fast[head] - naive[head]) < FAST_ATOL, head


def test_fast_sweep_equals_naive_loop_on_padded_text(strong_model):
    """Text windows with a short (right-padded) last window, batches of 2, 3 heads per pass."""
    for n_words in range(400, 800, 20):  # a length whose last evaluation window is short
        evalset = text_evalset(strong_model, sample_text(n_words))
        if not bool(evalset.mask.all()):
            break
    assert not bool(evalset.mask.all())  # padding is exercised
    heads = all_heads(2, 4)
    reps = replacements(strong_model.model, evalset, "mean", seed=0, batch_size=2)
    naive = _naive_deltas(strong_model, evalset, heads, reps)
    fast = _fast_deltas(strong_model, evalset, heads, reps, batch_size=2, heads_per_pass=3)
    for head in heads:
        assert abs(fast[head] - naive[head]) < FAST_ATOL, head


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_unembedding_equals_full_log_softmax(bias):
    """The sweep's chunked logsumexp against the textbook log_softmax over the whole vocabulary;
    the chunk (7) does not divide the vocabulary (50), so the last chunk is partial."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=bias)
    hidden = torch.randn(3, 11, 16, generator=gen) * 4  # [copies, n, d_model]
    targets = torch.randint(0, 50, (11,), generator=gen)  # [n]
    with torch.no_grad():
        full = -torch.log_softmax(head(hidden), -1)[:, torch.arange(11), targets]  # [copies, n]
        chunked = unembed_losses(hidden, head, targets, chunk=7)
    assert chunked.shape == (3, 11)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_unembedding_gradients_equal_autograd_of_log_softmax(bias):
    """The hand-written backward pass against autograd through the textbook form (float64)."""
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=bias).double()
    hidden = (torch.randn(3, 11, 16, generator=gen, dtype=torch.float64) * 4).requires_grad_(True)
    targets = torch.randint(0, 50, (11,), generator=gen)  # [n]
    weights = torch.rand(3, 11, generator=gen, dtype=torch.float64)  # a non-uniform upstream gradient
    full = -torch.log_softmax(head(hidden), -1)[:, torch.arange(11), targets]  # [copies, n]
    want = torch.autograd.grad((full * weights).sum(), [hidden, *head.parameters()])
    chunked = unembed_losses(hidden, head, targets, chunk=7)
    got = torch.autograd.grad((chunked * weights).sum(), [hidden, *head.parameters()])
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)  # float64 throughout: rounding only


def test_sweep_heads_frame(strong_model):
    frame = sweep_heads(strong_model, metric="repeat", heads=[Head(1, 2), Head(0, 3)]).frame
    assert list(frame.columns) == [
        "layer",
        "head",
        "n",
        "clean",
        "ablated",
        "delta",
        "ci95_low",
        "ci95_high",
        "n_tokens",
        "loss",
        "loss_ablated",
        "delta_loss",
    ]
    assert frame[["layer", "head"]].values.tolist() == [[0, 3], [1, 2]]
    assert ((frame.ci95_low <= frame.delta_loss) & (frame.delta_loss <= frame.ci95_high)).all()


# Durable rows -----------------------------------------------------------------------------------


def test_out_and_resume_keep_every_row(strong_model, tmp_path, monkeypatch):
    from headlens.ablation.store import SweepStore

    heads = all_heads(2, 4)
    full = sweep_heads(strong_model, metric="repeat", heads=heads).frame
    out = tmp_path / "sweep"
    append = SweepStore.append

    def crash_after_three(self, row):
        if len(self.done) == 3:
            raise KeyboardInterrupt  # interrupted mid-sweep
        append(self, row)

    monkeypatch.setattr(SweepStore, "append", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        sweep_heads(strong_model, metric="repeat", heads=heads, out=out)
    monkeypatch.setattr(SweepStore, "append", append)
    rows = (out / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 3 and not (out / "sweep.csv").exists()
    with open(out / "rows.jsonl", "a") as handle:
        handle.write(rows[-1][:17])  # a torn line, as a kill during the write leaves it
    resumed = sweep_heads(strong_model, metric="repeat", heads=heads, out=out, resume=True).frame
    assert resumed.equals(full)
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == len(heads) == len({(json.loads(x)["layer"], json.loads(x)["head"]) for x in lines})
    assert (out / "sweep.csv").is_file()


def test_resume_from_other_settings_is_refused(strong_model, tmp_path):
    out = tmp_path / "sweep"
    sweep_heads(strong_model, metric="repeat", heads=[Head(0, 0)], out=out)
    with pytest.raises(ConfigError, match="other settings"):
        sweep_heads(strong_model, metric="repeat", method="mean", heads=[Head(0, 0)], out=out, resume=True)
    with pytest.raises(OutputPathError, match="--resume"):
        sweep_heads(strong_model, metric="repeat", heads=[Head(0, 0)], out=out)


# Attribution patching ---------------------------------------------------------------------------


def test_attribution_equals_minus_grad_dot_z(strong_model):
    """Peer: weights with grad, z kept with retain_grad, plain backward: -sum(z.grad * z) per head."""
    from headlens.ablation.gradients import attribution_deltas
    from headlens.intervene.metrics import token_losses

    evalset = repeat_evalset(strong_model, seed=2, n_seq=3, seq_len=10)
    ours = attribution_deltas(strong_model.model, evalset, [None, None])  # [layer, head]
    kept = {}

    def keep(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:-1], 4, 16)  # [batch, pos, head, d_head]
            z.retain_grad()
            kept[layer] = z
            return (z.reshape(args[0].shape),)

        return hook

    model = strong_model.model
    handles = [model.transformer.h[i].attn.c_proj.register_forward_pre_hook(keep(i)) for i in range(2)]
    try:
        logits = model(input_ids=evalset.input_ids).logits  # [n_seq, pos, d_vocab]
        losses = token_losses(logits, evalset.input_ids, evalset.mask)[evalset.counted]
        losses.mean().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    theirs = torch.stack([-(kept[i].grad * kept[i]).sum((0, 1, 3)) for i in range(2)])  # [layer, head]
    assert torch.allclose(ours, theirs.detach(), rtol=GRAD_RTOL, atol=1e-7)


def test_approx_sweep_agrees_with_exact_on_small_effects(small_model):
    """At GPT-2's init scale heads barely move the loss, where the linear estimate should hold."""
    from headlens.ablation.approx import agreement, approx_sweep

    exact = sweep_heads(small_model, metric="repeat").frame
    approx = approx_sweep(small_model, metric="repeat", approx="atp")
    result = agreement(exact, approx)
    assert result["n_heads"] == 8
    assert result["pearson"] > 0.9  # first-order regime: an honest expectation, not a tuned threshold


# Errors -------------------------------------------------------------------------------------------


def test_errors(strong_model):
    from headlens.ablation.ablate import ablate_heads

    with pytest.raises(ConfigError, match="unknown ablation method"):
        sweep_heads(strong_model, method="shuffle")
    with pytest.raises(ConfigError, match="unknown metric"):
        ablate_heads(strong_model, "0.0", metric="bleu")
    with pytest.raises(InputTextError, match="at least 2"):
        ablate_heads(strong_model, "0.0", text="the")
    with pytest.raises(ConfigError, match="--prompts"):
        ablate_heads(strong_model, "0.0", metric="prob")
    one_window = "the" + " the" * 62  # 63 tokens + BOS = exactly one 64-token window
    assert isinstance(text_evalset(strong_model, one_window), EvalSet)

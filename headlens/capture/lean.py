"""The lean capture path: sdpa runs the model, patterns are rebuilt in blocks of query rows.

Hugging Face eager attention materialises the [batch, head, q_pos, k_pos] scores two or three
times per layer (matmul, mask, softmax): at 1 x 1024 tokens on GPT-2 small that is most of a
forward pass's added memory. Here the model runs with `sdpa`, which never builds a pattern, and
the architecture adapter's `hook_qkv` hands over the layer's own Q, K and V as the attention
uses them (after rotary positions and q/k norms; no projection is recomputed). The pattern goes
to the reducers in blocks of query rows of at most `BLOCK_ELEMENTS` weights, each block a fresh
[batch, head, rows, k_pos] buffer (headlens.arch.mha.pattern_rows). Reducers that accept blocks say
so with `row_blocks = True`; a layer that feeds any other reducer gets its whole pattern in one
block.

The check (first batch of a run, per layer) is stronger than on the eager path: besides the
pattern being causal and row-stochastic (capture.reducers.check_pattern, per block),
pattern @ V must equal the z the model itself computed at its output projection, so the rebuilt
pattern is the model's own. It is computed on the first and the last block of query rows (the
shortest and the longest rows: a wrong scale, rotation, mask or window shows in both), as
pattern @ V on every block would cost d_head multiply-adds per pattern weight, a sixth of a
30-layer model's forward at 2048 tokens. Each block costs a handful of tensor operations: the
key/value expansion and the visibility mask are made once per layer.
"""

from __future__ import annotations

import torch

from headlens.arch.mha import pattern_rows, visible_keys
from headlens.capture.reducers import check_atol
from headlens.errors import LeanCheckError

# Attention weights per block: 12 heads x 128 rows x 1024 keys (6.3 MB in float32) at GPT-2
# small's full context, against 50 MB for a whole layer's pattern (benchmarks/bench_capture.py).
# Short sequences get more rows per block (fewer reducer calls): 1 x 300 tokens is one block.
BLOCK_ELEMENTS = 12 * 128 * 1024


def block_rows(batch: int, n_heads: int, pos: int) -> int:
    """Query rows per block for a [batch, n_heads, rows, pos] block within BLOCK_ELEMENTS."""
    return max(1, BLOCK_ELEMENTS // (batch * n_heads * pos))


# pattern @ V against the model's z: sdpa and our softmax differ by float32 rounding (~1e-6
# on GPT-2-small-sized activations); a wrong pattern is off by the size of V itself. Half
# precision: 20 epsilons of the dtype (capture.check_atol).
Z_CHECK_RTOL = 1e-4
Z_CHECK_EPS = 20


def takes_blocks(reducers) -> bool:
    """True if every reducer that wants patterns accepts blocks of query rows."""
    return all(getattr(r, "row_blocks", False) for r in reducers if "pattern" in r.wants)


class LeanLayer:
    """The lean path's hooks for one layer.

    `on_qkv` (the adapter's `hook_qkv`) dispatches the pattern block by block; `on_z` (the
    adapter's `hook_z`) compares pattern @ V with the model's z while `verify` is set (the first
    batch), then stops checking.
    """

    def __init__(self, layer: int, adapter, blocks: bool, hooks, dispatch, verify: bool):
        self.layer, self.n_heads = layer, adapter.n_heads
        self.scale = adapter.attention_scale(layer)
        self.window = adapter.sliding_window(layer)
        self.blocks, self.hooks, self.dispatch = blocks, hooks, dispatch  # hooks.batch: the batch being run
        self.verify = verify
        self._expected: list[tuple[int, torch.Tensor]] = []  # (first row, pattern @ V) of the checked blocks

    def on_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """q [batch, head, pos, d_head]; k, v [batch, kv_head, pos, d_head]. The pattern is
        rebuilt in float32 whatever the model's dtype (Hugging Face eager attention also takes
        its softmax in float32), so reducers accumulate float32 weights."""
        q, k, v = (t.detach().float() for t in (q, k, v))
        mask = self.hooks.batch.mask.to(q.device)  # [batch, pos]
        batch, _, pos, _ = q.shape
        step = block_rows(batch, self.n_heads, pos) if self.blocks else pos
        groups = self.n_heads // k.shape[1]
        k = k.repeat_interleave(groups, dim=1) if groups > 1 else k  # [batch, head, pos, d_head], once per layer
        visible = visible_keys(mask, self.window)  # [batch, 1, q_pos, k_pos], once per layer
        if self.verify:
            v = v.repeat_interleave(groups, dim=1) if groups > 1 else v  # [batch, head, pos, d_head]
        starts = list(range(0, pos, step))
        for start in starts:
            stop = min(pos, start + step)
            pattern = pattern_rows(q, k, mask, self.scale, start, stop, visible=visible)  # [batch, head, rows, k_pos]
            if self.verify and start in (starts[0], starts[-1]):  # the first rows and the longest rows
                self._expected.append((start, pattern @ v))  # [batch, head, rows, d_head]
            self.dispatch(self.layer, "pattern", pattern, start if self.blocks else None)

    def on_z(self, z: torch.Tensor) -> None:
        """Compare the checked blocks' pattern @ V with the model's z, on the device; the
        verdict waits for the end of the batch (`hooks.checks`, one host copy per batch)."""
        if not self._expected:
            return
        z = z.detach().transpose(1, 2)  # [batch, head, pos, d_head]
        real = self.hooks.batch.mask.to(z.device)[:, None, :, None]  # [batch, 1, pos, 1]
        errs, scales = [], [torch.ones((), device=z.device)]
        for start, expected in self._expected:
            rows = slice(start, start + expected.shape[2])
            errs.append(((z[:, :, rows] - expected).abs() * real[:, :, rows]).amax())
            scales.append((expected.abs() * real[:, :, rows]).amax())
        self._expected, self.verify = [], False
        found = torch.stack([torch.stack(errs).amax(), torch.stack(scales).amax()])  # [2] error, scale
        self.hooks.checks.append((found, lambda host, dtype=z.dtype: self._judge(*host, dtype)))

    def _judge(self, err: float, scale: float, dtype: torch.dtype) -> None:
        if err > check_atol(dtype, Z_CHECK_RTOL, Z_CHECK_EPS) * scale:
            raise LeanCheckError(
                f"layer {self.layer}: the rebuilt attention pattern does not reproduce the "
                f"model's z (max error {err:.2e}); run the capture with recompute_patterns=False"
            )


def lean_hooks(hooks, needs: dict[int, set[str]], reducers, dispatch, check: bool) -> None:
    """Add the lean path's hooks to `hooks` (headlens.arch.hooks.Hooks) for every layer that needs patterns."""
    for layer, kinds in needs.items():
        if "pattern" not in kinds:
            continue
        wanting = [r for r in reducers if "pattern" in r.wants and (r.layers is None or layer in r.layers)]
        lean = LeanLayer(layer, hooks.adapter, takes_blocks(wanting), hooks, dispatch, verify=check)
        hooks.qkv(layer, lean.on_qkv)
        if check:
            hooks.z(layer, lean.on_z)

"""Streaming per-head capture: hooks hand each layer's patterns and z to reducers.

Sites come from the model's architecture adapter (headlens.arch):
- pattern, eager path: output[1] of the layer's attention module  # [batch, head, q_pos, k_pos]
- pattern, lean path (headlens.capture.lean, run_capture's default on Hugging Face models when
  every pattern reducer takes blocks of query rows): rebuilt from the layer's own Q and K;
- z: the input of the output projection, `Adapter.hook_z`  # [batch, pos, head, d_head]
On a TransformerLens `TransformerBridge`: `blocks.{L}.attn.hook_pattern` and `hook_z`.
Hooks are GLOBAL state (TransformerLens docs), so they are only ever installed inside one
scoped `Hooks` context (headlens.arch.hooks) that removes them on exit, error included.
Reducers' statistics and the checks stay on the model's device during a batch; `end_batch`
copies them to the host together, once per batch (headlens.capture.reducers.flush_to_host).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from headlens.arch import adapter_for
from headlens.arch.context import NO_PATTERN, attention_implementation
from headlens.arch.hooks import Hooks
from headlens.capture.bridge import bridge_hooks, is_bridge, n_layers_of
from headlens.capture.lean import lean_hooks, takes_blocks
from headlens.capture.reducers import Batch, Reducer, flush_to_host, pattern_violations, raise_violations
from headlens.errors import CaptureError


class CaptureHooks(Hooks):
    """The capture's scoped hooks, plus what waits for the end of the batch: the reducers' pending
    device-side sums and `checks`, (device tensor, fn(host tensor)) pairs whose fn may raise."""

    def __init__(self, adapter, reducers: Sequence[Reducer]):
        super().__init__(adapter)
        self.reducers = reducers
        self.checks: list[tuple[torch.Tensor, object]] = []

    def end_batch(self) -> None:
        """One copy to the host: every pending statistic and check of the batch just run."""
        checks, self.checks = self.checks, []
        flush_to_host(self.reducers, checks)


@contextlib.contextmanager
def _end_batch_at_exit(hooks: CaptureHooks):
    """On a normal exit, what the last batch left pending (a caller that ran its own forwards)."""
    yield
    hooks.end_batch()


@contextlib.contextmanager
def capture_hooks(model, reducers: Sequence[Reducer], check: bool = True, recompute_patterns: bool = False):
    """Install the hooks that feed `reducers` in one scoped `Hooks` context (headlens.arch.hooks:
    removed on exit, error or not) and yield it: set `hooks.batch` to the Batch being run before
    each forward pass, and call `hooks.end_batch()` after it (the context's exit does so for the
    last). `recompute_patterns` (HF models only, run with sdpa): the lean path, headlens.capture.lean.
    """
    n_layers = n_layers_of(model)
    needs: dict[int, set[str]] = {}
    for reducer in reducers:
        for layer in reducer.layers if reducer.layers is not None else range(n_layers):
            if not 0 <= layer < n_layers:
                raise CaptureError(
                    f"layer {layer} is out of range: this model has {n_layers} layers (0-{n_layers - 1})"
                )
            needs.setdefault(layer, set()).update(reducer.wants)
    checked: set[int] = set()
    bridge = is_bridge(model)
    with CaptureHooks(None if bridge else adapter_for(model), reducers) as hooks:
        hooks.enter(_end_batch_at_exit(hooks))

        def dispatch(layer: int, kind: str, value: torch.Tensor, q_start: int | None = None) -> None:
            batch = hooks.batch
            if kind == "pattern" and check and layer not in checked:
                found = pattern_violations(value, batch.mask, q_start or 0)  # [3] on the device
                hooks.checks.append((found, lambda host, layer=layer: raise_violations(host, layer)))
                if (q_start or 0) + value.shape[-2] >= value.shape[-1]:  # the last block of the layer
                    checked.add(layer)
            extra = {} if q_start is None else {"q_start": q_start}
            for reducer in reducers:
                if kind in reducer.wants and (reducer.layers is None or layer in reducer.layers):
                    reducer.update(layer, batch, **{kind: value}, **extra)

        if bridge:
            hooks.enter(bridge_hooks(model, needs, dispatch))
        else:
            _hf_hooks(hooks, needs, reducers, dispatch, check, recompute_patterns)
        yield hooks


def _hf_hooks(hooks: Hooks, needs: dict[int, set[str]], reducers, dispatch, check: bool, recompute: bool) -> None:
    """The Hugging Face model's capture hooks, on the adapter's sites."""
    adapter = hooks.adapter
    if recompute:
        lean_hooks(hooks, needs, reducers, dispatch, check)
    for layer, kinds in needs.items():
        if "pattern" in kinds and not recompute:
            hooks.output(
                adapter.attn(layer),  # pattern [batch, head, q_pos, k_pos]
                lambda out, layer=layer: dispatch(layer, "pattern", attention_pattern(out)),
            )
        if "z" in kinds:
            hooks.z(layer, lambda z, layer=layer: dispatch(layer, "z", z))


def attention_pattern(output) -> torch.Tensor:
    """The pattern [batch, head, q_pos, k_pos] an eager attention module returns as output[1]."""
    pattern = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if pattern is None:
        raise CaptureError("the model returned no attention pattern: load it with attn_implementation='eager'")
    return pattern


def run_capture(
    model,
    batches: Iterable[Batch],
    reducers: Sequence[Reducer],
    check: bool = True,
    progress: bool = False,
    desc: str = "capture",
    recompute_patterns: bool | None = None,
) -> None:
    """Run the model over `batches`, streaming activations into `reducers` (no grad).

    Works on a Hugging Face model of a supported family and on a TransformerLens TransformerBridge.
    No logits are kept (HF: the LM head is not even run); reducers hold the results.
    `recompute_patterns` (HF only): True runs the lean path (headlens.capture.lean: sdpa
    forward, each layer's pattern rebuilt from its own Q and K, in blocks of query rows for
    reducers that take them, checked against the model's z); patterns then agree with HF eager
    within float32 rounding, not bit for bit. None (default) picks it on HF models when every
    pattern reducer takes row blocks (all of headlens's scorers do), else the eager hooks.
    """
    batches = list(batches) if progress else batches
    iterator = batches
    if progress:
        iterator = tqdm(batches, desc=desc, unit="batch", leave=False)
    if recompute_patterns and is_bridge(model):
        raise CaptureError("recompute_patterns is for Hugging Face models: a TransformerBridge builds its own patterns")
    recompute = recompute_patterns
    if recompute is None:
        recompute = not is_bridge(model) and any("pattern" in r.wants for r in reducers) and takes_blocks(reducers)
    implementation = attention_implementation(model, NO_PATTERN) if recompute else contextlib.nullcontext()
    with torch.no_grad(), implementation, capture_hooks(model, reducers, check, recompute) as hooks:
        for batch in iterator:
            hooks.batch = batch
            _forward_trunk(model, batch)
            hooks.end_batch()


def _forward_trunk(model, batch: Batch) -> None:
    """The forward pass capture needs. On Hugging Face models only the trunk runs:
    capture discards the logits, and the LM head costs d_model x d_vocab multiply-adds per token
    plus a [batch, pos, d_vocab] tensor (206 MB at 1 x 1024 for GPT-2). A bridge runs whole."""
    if is_bridge(model):
        forward(model, batch)
        return
    device = next(model.parameters()).device
    adapter_for(model).run_trunk(batch.input_ids.to(device), batch.mask.to(device))


def forward(model, batch: Batch) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] of one right-padded batch on an HF model or a bridge."""
    device = next(model.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.mask.to(device)
    if is_bridge(model):
        return model(ids, attention_mask=mask.long())
    return model(input_ids=ids, attention_mask=mask.long()).logits

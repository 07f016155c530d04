"""Streaming per-head capture: hooks hand each layer's patterns and z to reducers.

A reducer folds one layer of one batch into running statistics and keeps nothing else, so
scoring every head over many sequences never holds more than one layer's pattern of one batch
(`run_with_cache` on GPT-2 small at 1024 tokens holds ~1.2 GB per sequence).

Hook sites (Hugging Face GPT-2, eager attention):
- pattern: output[1] of `transformer.h[L].attn`   # [batch, head, q_pos, k_pos]
- z: the input of `transformer.h[L].attn.c_proj`  # [batch, pos, head * d_head] -> [batch, pos, head, d_head]
On a TransformerLens `TransformerBridge`: `blocks.{L}.attn.hook_pattern` and `hook_z`.
The lean path (headlens.capture_lean, run_capture's default on HF models when every pattern
reducer takes blocks of query rows) hooks `attn.c_attn` instead and rebuilds the pattern there.
Hooks are GLOBAL state (TransformerLens docs), so they are only ever installed inside a
context manager that removes them on exit, error included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from headlens.errors import HeadlensError

# Tolerance of the once-per-run sanity check on patterns: causal and row-stochastic (float32).
PATTERN_CHECK_ATOL = 1e-4
# Half-precision models round each weight to ~eps(dtype) (1e-3 in float16, 8e-3 in bfloat16):
# the check allows this many of their epsilons, still far below a missing mask's ~0.5 per row.
PATTERN_CHECK_EPS = 10


def check_atol(dtype: torch.dtype, base: float = PATTERN_CHECK_ATOL, eps_multiple: float = PATTERN_CHECK_EPS) -> float:
    """Tolerance of a sanity check on tensors of `dtype`: `base` for float32, looser for half precision."""
    return max(base, eps_multiple * torch.finfo(dtype).eps) if dtype.is_floating_point else base


class CaptureError(HeadlensError, RuntimeError):
    """The model does not expose what the capture needs (e.g. sdpa attention: no pattern)."""


@dataclass
class Batch:
    """One batch of right-padded token sequences."""

    input_ids: torch.Tensor  # [batch, pos] token ids; padding positions hold any valid id
    mask: torch.Tensor  # [batch, pos] bool, True on real tokens (a prefix of each row)
    index: int = 0  # batch number within the run
    offset: int = 0  # index of this batch's first sequence within the run


class Reducer:
    """Base class: override `update`; set `wants` to the activations needed.

    `update(layer, batch, pattern=None, z=None)` is called once per captured layer, batch and
    wanted kind (a reducer wanting both gets one call with `pattern`, one with `z`); pattern is
    [batch, head, q_pos, k_pos], z is [batch, pos, head, d_head]. Padded query rows are
    present: mask them with `batch.mask`. Do not keep references: reduce and drop.

    A reducer that sets `row_blocks = True` may instead be handed each layer's pattern in
    blocks of query rows, `update(layer, batch, pattern=block, q_start=q0)` with block
    [batch, head, rows, k_pos] holding rows q0..q0+rows-1, in order, covering every row (the
    lean path, headlens.capture_lean); without `q_start` the pattern is whole.
    """

    wants: frozenset[str] = frozenset({"pattern"})
    layers: Sequence[int] | None = None  # None: every layer
    row_blocks: bool = False  # True: accepts pattern blocks of query rows (see above)

    def update(self, layer: int, batch: Batch, pattern: torch.Tensor | None = None,
               z: torch.Tensor | None = None) -> None:
        raise NotImplementedError  # abstract: subclasses define the statistic


class CollectPatterns(Reducer):
    """Keeps full patterns (for tests and small inputs only): patterns[layer] is a list per batch."""

    def __init__(self, wants=("pattern",), layers=None):
        self.wants = frozenset(wants)
        self.layers = layers
        self.patterns: dict[int, list[torch.Tensor]] = {}
        self.zs: dict[int, list[torch.Tensor]] = {}

    def update(self, layer, batch, pattern=None, z=None):
        if pattern is not None:
            self.patterns.setdefault(layer, []).append(pattern.detach().clone())
        if z is not None:
            self.zs.setdefault(layer, []).append(z.detach().clone())


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: returns input_ids [batch, pos] and mask [batch, pos] (bool)."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(sequences), longest), dtype=torch.bool)  # [batch, pos]
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = True
    return ids, mask


def iter_batches(sequences: Sequence[Sequence[int]] | torch.Tensor, batch_size: int,
                 pad_id: int = 0) -> Iterator[Batch]:
    """Split sequences (a list of token lists, or a [n, pos] tensor) into right-padded Batches."""
    for index, start in enumerate(range(0, len(sequences), batch_size)):
        chunk = sequences[start : start + batch_size]
        if isinstance(chunk, torch.Tensor):
            ids, mask = chunk.long(), torch.ones_like(chunk, dtype=torch.bool)
        else:
            ids, mask = pad_batch(chunk, pad_id)
        yield Batch(ids, mask, index=index, offset=start)


def is_bridge(model) -> bool:
    """True for a TransformerLens TransformerBridge (or anything with TL-style hook points).

    A bridge forwards unknown attributes to the HF model it wraps, so it *also* has
    `.transformer`: test for TransformerLens's own attributes only.
    """
    return hasattr(model, "blocks") and hasattr(model, "hooks") and hasattr(model, "cfg")


def n_layers_of(model) -> int:
    return model.cfg.n_layers if is_bridge(model) else model.config.n_layer


def n_heads_of(model) -> int:
    return model.cfg.n_heads if is_bridge(model) else model.config.n_head


def check_pattern(pattern: torch.Tensor, mask: torch.Tensor, layer: int, q_start: int = 0) -> None:
    """Raise CaptureError unless the pattern is a causal, row-stochastic attention pattern.

    An old eager fallback once ran without the causal mask (REFERENCES, pitfalls). Checked on
    real (unpadded) query rows: every weight >= -atol; every row sums to 1 within atol; the mass
    above the diagonal, averaged over a sequence's rows, is <= atol per head. The last test is an
    average because it is computed as (total mass) - (mass on and below the diagonal), the second
    as one matrix-vector product: ~40 ms at 12 heads x 1024 tokens instead of ~300 ms for an
    explicit upper triangle, and a missing causal mask puts ~0.5 per row above the diagonal.
    pattern: [batch, head, rows, k_pos], query rows q_start.. (a whole pattern: q_start 0, rows
    = k_pos); mask: [batch, pos], a prefix of True per row.
    """
    p = pattern.detach()
    if p.numel() == 0:
        return
    atol = check_atol(p.dtype)
    if p.amin().item() < -atol:
        raise CaptureError(f"layer {layer}: attention pattern has negative weights")
    n_rows, n_keys = p.shape[-2], p.shape[-1]
    rows = p.sum(-1, dtype=torch.float32)  # [batch, head, rows]
    real = mask.to(rows.device)[:, q_start:q_start + n_rows]  # [batch, rows]
    lower = torch.ones(n_rows, n_keys, dtype=p.dtype, device=p.device).tril(q_start)  # [rows, k_pos]: k <= q
    for row, n_real in enumerate(real.sum(-1).tolist()):
        if n_real == 0:
            continue
        block = p[row, :, :n_real, :].reshape(p.shape[1], -1)  # [head, n_real * k_pos] (a view)
        on_or_below = block @ lower[:n_real].reshape(-1)  # [head]
        above = rows[row, :, :n_real].sum(-1) - on_or_below  # [head] mass above the diagonal
        if above.amax().item() > atol * n_real:
            raise CaptureError(f"layer {layer}: attention pattern is not causal (weight above the diagonal)")
    if ((rows - 1).abs() * real[:, None, :]).amax().item() > atol:
        raise CaptureError(f"layer {layer}: attention rows do not sum to 1")


@contextlib.contextmanager
def capture_hooks(model, reducers: Sequence[Reducer], batch_ref: list, check: bool = True,
                  recompute_patterns: bool = False):
    """Install the hooks that feed `reducers`; removes them on exit, error or not.

    `batch_ref[0]` must hold the Batch being run when the forward pass happens.
    `recompute_patterns` (HF models only, run with sdpa): the lean path, headlens.capture_lean.
    """
    n_layers = n_layers_of(model)
    needs: dict[int, set[str]] = {}
    for reducer in reducers:
        for layer in (reducer.layers if reducer.layers is not None else range(n_layers)):
            if not 0 <= layer < n_layers:
                raise CaptureError(f"layer {layer} is out of range: this model has {n_layers} layers "
                                   f"(0-{n_layers - 1})")
            needs.setdefault(layer, set()).update(reducer.wants)
    checked: set[int] = set()

    def dispatch(layer: int, kind: str, value: torch.Tensor, q_start: int | None = None) -> None:
        batch = batch_ref[0]
        if kind == "pattern" and check and layer not in checked:
            check_pattern(value, batch.mask, layer, q_start or 0)
            if (q_start or 0) + value.shape[-2] >= value.shape[-1]:  # the last block of the layer
                checked.add(layer)
        extra = {} if q_start is None else {"q_start": q_start}
        for reducer in reducers:
            if kind in reducer.wants and (reducer.layers is None or layer in reducer.layers):
                reducer.update(layer, batch, **{kind: value}, **extra)

    if is_bridge(model):
        with _bridge_hooks(model, needs, dispatch):
            yield
        return
    handles = []
    try:
        if recompute_patterns:
            from headlens.capture_lean import lean_hooks

            handles += lean_hooks(model, needs, reducers, batch_ref, dispatch, check)
        for layer, kinds in needs.items():
            attn = model.transformer.h[layer].attn
            if "pattern" in kinds and not recompute_patterns:
                handles.append(attn.register_forward_hook(_hf_pattern_hook(layer, dispatch)))
            if "z" in kinds:
                handles.append(attn.c_proj.register_forward_pre_hook(_hf_z_hook(layer, attn.num_heads, dispatch)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hf_pattern_hook(layer, dispatch):
    def hook(module, args, output):
        pattern = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if pattern is None:
            raise CaptureError("the model returned no attention pattern: load it with attn_implementation='eager'")
        dispatch(layer, "pattern", pattern)  # [batch, head, q_pos, k_pos]

    return hook


@contextlib.contextmanager
def _attention_implementation(model, name: str):
    """Temporarily run every attention module of `model` with implementation `name`."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {key: cfg._attn_implementation for key, cfg in configs.items()}
    try:
        for cfg in configs.values():
            cfg._attn_implementation = name
        yield
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation = saved[key]


def _hf_z_hook(layer, n_heads, dispatch):
    def hook(module, args):
        merged = args[0]  # [batch, pos, head * d_head]
        z = merged.view(*merged.shape[:-1], n_heads, merged.shape[-1] // n_heads)  # [batch, pos, head, d_head]
        dispatch(layer, "z", z)

    return hook


@contextlib.contextmanager
def _bridge_hooks(model, needs, dispatch):
    names = {"pattern": "hook_pattern", "z": "hook_z"}
    fwd_hooks = []
    for layer, kinds in needs.items():
        for kind in kinds:
            def hook(value, hook, layer=layer, kind=kind):
                dispatch(layer, kind, value)
                return value

            fwd_hooks.append((f"blocks.{layer}.attn.{names[kind]}", hook))
    with model.hooks(fwd_hooks=fwd_hooks):
        yield


def run_capture(model, batches: Iterable[Batch], reducers: Sequence[Reducer], check: bool = True,
                progress: bool = False, desc: str = "capture", recompute_patterns: bool | None = None) -> None:
    """Run the model over `batches`, streaming activations into `reducers` (no grad).

    Works on a Hugging Face GPT-2 (eager attention) and on a TransformerLens TransformerBridge.
    No logits are kept (HF: the LM head is not even run); reducers hold the results.
    `recompute_patterns` (HF only): True runs the lean path (headlens.capture_lean: sdpa
    forward, each layer's pattern rebuilt from its own Q and K, in blocks of query rows for
    reducers that take them, checked against the model's z); patterns then agree with HF eager
    within float32 rounding, not bit for bit. None (default) picks it on HF models when every
    pattern reducer takes row blocks (all of headlens's scorers do), else the eager hooks.
    """
    batches = list(batches) if progress else batches
    iterator = batches
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(batches, desc=desc, unit="batch", leave=False)
    batch_ref: list = [None]
    if recompute_patterns and is_bridge(model):
        raise CaptureError("recompute_patterns is for Hugging Face models: a TransformerBridge builds its own patterns")
    recompute = recompute_patterns
    if recompute is None:
        from headlens.capture_lean import takes_blocks

        recompute = (not is_bridge(model) and hasattr(model, "transformer")
                     and any("pattern" in r.wants for r in reducers) and takes_blocks(reducers))
    implementation = _attention_implementation(model, "sdpa") if recompute else contextlib.nullcontext()
    with torch.no_grad(), implementation, capture_hooks(model, reducers, batch_ref, check, recompute):
        for batch in iterator:
            batch_ref[0] = batch
            _forward_trunk(model, batch)


def _forward_trunk(model, batch: Batch) -> None:
    """The forward pass capture needs. On Hugging Face GPT-2 only the transformer trunk runs:
    capture discards the logits, and the LM head costs d_model x d_vocab multiply-adds per token
    plus a [batch, pos, d_vocab] tensor (206 MB at 1 x 1024 for GPT-2). A bridge runs whole."""
    if is_bridge(model) or not hasattr(model, "transformer"):
        forward(model, batch)
        return
    device = next(model.parameters()).device
    model.transformer(input_ids=batch.input_ids.to(device), attention_mask=batch.mask.to(device).long())


def forward(model, batch: Batch) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] of one right-padded batch on an HF model or a bridge."""
    device = next(model.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.mask.to(device)
    if is_bridge(model):
        return model(ids, attention_mask=mask.long())
    return model(input_ids=ids, attention_mask=mask.long()).logits

"""Validate the from-scratch attention (headlens.arch.mha) against the library, layer by layer.

The shape of minGPT's one test: same weights, same input, compare outputs. For each layer the
*true* input of its attention (the output of its input norm, GPT-2 `ln_1`, Llama
`input_layernorm`, captured by a hook during a real forward pass) is fed through our attention
(`CausalSelfAttention.from_gpt2` for GPT-2; `GroupedQueryAttention` on the weights the
architecture adapter reads for the rotary families), and the per-head pattern, z and the
attention output are compared with three references:
- `hf_eager`: what the Hugging Face model computed in that same forward pass (pattern and z via
  headlens.capture's hooks, attn_out via a hook on the attention module);
- `sdpa`: torch.nn.functional.scaled_dot_product_attention on the Q, K, V the model's own
  attention computed in that pass (after rotary and q/k norms; `enable_gqa=True` where key/value
  heads are shared), then the model's own output projection (z and attn_out; sdpa never builds a
  pattern);
- `transformer_lens`: a TransformerBridge around a separate copy of the model
  (`blocks.{L}.attn.hook_pattern`, `hook_z`, and `blocks.{L}.attn.hook_out`, the attention
  module's own output: `blocks.{L}.hook_attn_out` is what enters the residual, which Gemma 3
  normalises first), for the families TransformerLens's bridge boots (TL_FAMILIES).
Only real (non-padding) query positions are compared.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

from headlens.arch import adapter_for, get_module
from headlens.capture import Batch, CollectPatterns, pad_batch, run_capture
from headlens.errors import ConfigError, InputTextError, ValidationFailed
from headlens.load.devices import DTYPES
from headlens.load.models import LoadedModel, boot_bridge
from headlens.probes.inputs import default_text, text_windows
from headlens.results import Result

# Largest max-absolute-error accepted between our attention and a reference in float32, times the
# reference's largest magnitude when above 1. float32 has ~1.2e-7 relative precision; reordered sums
# over d_model <= 1600 terms stay orders of magnitude below 1e-5 of the values (Gemma 3 270M's first
# layers reach |attn_out| ~ 345, where sdpa's reordering differs by 4.6e-5, 1.3e-7 of it), while a
# real bug (wrong transpose, scale, mask, norm or rotary base) is off by the values themselves.
VALIDATION_ATOL = 1e-5
# Half precision: each value is rounded to ~eps(dtype) (7.8e-3 bfloat16, 9.8e-4 float16), and the
# references round in different places (eager takes the softmax in float32, sdpa fuses it): the
# shipped model shows up to ~4 eps in bfloat16 and ~5 eps in float16. Tolerance: this many eps of
# the dtype, times the reference's largest magnitude when above 1 (a wrong mask or transpose is
# off by the values themselves).
HALF_EPS_MULTIPLE = 8
# Used when no text is given and the shipped model's held-out text is absent.
BUILTIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. When Mary and John went to the store, "
    "John gave a drink to Mary, and the cat sat on the mat while the dog slept by the door."
)
WINDOW_TOKENS = 128  # tokens per validation sequence (BOS included), capped at the model's n_ctx
MAX_WINDOWS = 4  # sequences per validation batch: windows of unequal length exercise padding
COLUMNS = ["layer", "quantity", "reference", "max_abs_error", "tolerance", "passed"]
# Families whose TransformerLens 4 bridge boots offline from a config and a local model (each tried).
TL_FAMILIES = frozenset({"gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"})


def validation_text(text: str | None = None) -> tuple[str, str]:
    """(text, source): the given text, else probes.default_text() if shipped, else BUILTIN_TEXT."""
    if text is not None:
        return text, "given"

    try:
        return default_text(), "probes.default_text()"
    except InputTextError:  # the shipped model (and its held-out text) is not installed
        return BUILTIN_TEXT, "builtin sentence"


def validation_batch(loaded: LoadedModel, text: str) -> Batch:
    """Up to MAX_WINDOWS right-padded windows of the text, each starting with BOS."""

    window = min(WINDOW_TOKENS, loaded.spec.n_ctx)
    windows = text_windows(loaded.tokenizer, text, window, loaded.bos_token_id, max_windows=MAX_WINDOWS)
    ids, mask = pad_batch(windows, pad_id=loaded.bos_token_id)  # [batch, pos] each
    return Batch(ids, mask)


@contextlib.contextmanager
def _layer_io_hooks(model, store: dict):
    """Record each layer's attention input (its input norm's output), the q, k, v its attention
    used and its attention output."""
    adapter = adapter_for(model)

    def keep(layer, key, index=None):
        def on_output(output):
            value = output[index] if index is not None else output
            store.setdefault(layer, {})[key] = value.detach().clone()

        return on_output

    def keep_qkv(layer):
        def fn(q, k, v):  # q [batch, head, pos, d_head]; k, v [batch, kv_head, pos, d_head]
            store.setdefault(layer, {})["qkv"] = (q.clone(), k.clone(), v.clone())

        return fn

    with adapter.hooks() as hooks:
        for layer in range(adapter.n_layers):
            norm = get_module(adapter.layer(layer), adapter.sites.input_norm)
            hooks.output(norm, keep(layer, "x"))  # [batch, pos, d_model]
            hooks.output(adapter.attn(layer), keep(layer, "attn_out", 0))  # [batch, pos, d_model]
            hooks.qkv(layer, keep_qkv(layer))
        yield


def _capture_hf(model, batch: Batch) -> dict:
    store: dict[int, dict[str, torch.Tensor]] = {}
    collect = CollectPatterns(wants=("pattern", "z"))
    with _layer_io_hooks(model, store):
        run_capture(model, [batch], [collect])
    for layer in store:
        store[layer]["pattern"] = collect.patterns[layer][0]  # [batch, head, q_pos, k_pos]
        store[layer]["z"] = collect.zs[layer][0]  # [batch, pos, head, d_head]
    return store


def _capture_bridge(loaded: LoadedModel, batch: Batch) -> dict:
    bridge = boot_bridge(loaded)
    store: dict[int, dict[str, torch.Tensor]] = {}
    collect = CollectPatterns(wants=("pattern", "z"))

    def keep_attn_out(value, hook):
        layer = int(hook.name.split(".")[1])
        store.setdefault(layer, {})["attn_out"] = value.detach().clone()  # [batch, pos, d_model]
        return value

    hooks = [(f"blocks.{layer}.attn.hook_out", keep_attn_out) for layer in range(loaded.spec.n_layers)]
    with bridge.hooks(fwd_hooks=hooks):
        run_capture(bridge, [batch], [collect])
    for layer in store:
        store[layer]["pattern"] = collect.patterns[layer][0]  # [batch, head, q_pos, k_pos]
        store[layer]["z"] = collect.zs[layer][0]  # [batch, pos, head, d_head]
    return store


def _sdpa_reference(adapter, layer: int, qkv: tuple, mask: torch.Tensor) -> dict:
    """z and attn_out from torch's fused attention on the layer's own q, k, v, then its own W_O."""
    q, k, v = qkv  # q [batch, head, pos, d_head]; k, v [batch, kv_head, pos, d_head]
    batch, _, pos, _ = q.shape
    visible = torch.ones(pos, pos, dtype=torch.bool, device=q.device).tril()  # [q_pos, k_pos]
    window = adapter.sliding_window(layer)
    if window is not None:
        visible &= ~torch.ones(pos, pos, dtype=torch.bool, device=q.device).tril(-window)
    visible = visible[None, None] & mask[:, None, None, :]  # [batch, 1, q_pos, k_pos]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=visible, scale=adapter.attention_scale(layer), enable_gqa=k.shape[1] < q.shape[1]
    )
    z = out.transpose(1, 2)  # [batch, head, pos, d_head] -> [batch, pos, head, d_head]
    return {"z": z, "attn_out": adapter.z_module(layer)(z.reshape(batch, pos, -1))}  # attn_out [batch, pos, d_model]


def our_attention(model, layer: int) -> torch.nn.Module:
    """headlens.arch.mha's attention holding `layer`'s weights."""
    return adapter_for(model).scratch_attention(layer)


def validation_tolerance(dtype: torch.dtype, scale: float = 1.0) -> float:
    """Largest accepted max-abs error for a model of `dtype` whose reference values reach `scale`:
    VALIDATION_ATOL x max(1, scale) in float32, HALF_EPS_MULTIPLE eps of the dtype x max(1, scale) below it."""
    if dtype == torch.float32 or not dtype.is_floating_point:
        return VALIDATION_ATOL * max(1.0, scale)
    return HALF_EPS_MULTIPLE * torch.finfo(dtype).eps * max(1.0, scale)


def tolerance_rule(dtype: torch.dtype) -> str:
    """One line saying how the tolerance was set for `dtype` (printed with the table)."""
    if dtype == torch.float32:
        return f"tolerance {VALIDATION_ATOL:g} x max(1, largest |reference|) (float32)"
    return (
        f"tolerance scaled to {str(dtype).removeprefix('torch.')}: {HALF_EPS_MULTIPLE} x eps "
        f"({torch.finfo(dtype).eps:.2g}) x max(1, largest |reference|)"
    )


def _max_error(ours: torch.Tensor, ref: torch.Tensor, quantity: str, mask: torch.Tensor) -> tuple[float, float]:
    """Max |ours - ref| and max |ref| over real query positions (mask [batch, pos])."""
    diff = (ours.float() - ref.float()).abs()
    size = ref.float().abs()
    if quantity == "pattern":
        diff = diff.transpose(1, 2)  # [batch, head, q_pos, k_pos] -> [batch, q_pos, head, k_pos]
        size = size.transpose(1, 2)  # [batch, q_pos, head, k_pos]
    return float(diff[mask].max()), float(size[mask].max())  # over [n_real, ...]


def compare_attention(loaded: LoadedModel, batch: Batch) -> pd.DataFrame:
    """Run the comparison on one right-padded batch; one row per layer x quantity x reference."""
    model = loaded.model
    mask = batch.mask.to(next(model.parameters()).device)  # [batch, pos]
    adapter = loaded.adapter
    references = {"hf_eager": _capture_hf(model, batch)}
    if adapter.family in TL_FAMILIES:
        references["transformer_lens"] = _capture_bridge(loaded, batch)
    rows = []
    with torch.no_grad():
        for layer in range(loaded.spec.n_layers):
            hf = references["hf_eager"][layer]
            ours = our_attention(model, layer)(hf["x"], attention_mask=mask)._asdict()  # x [batch, pos, d_model]
            refs = {
                **{name: found[layer] for name, found in references.items()},
                "sdpa": _sdpa_reference(adapter, layer, hf["qkv"], mask),
            }
            for reference, values in refs.items():
                for quantity in ("pattern", "z", "attn_out"):
                    if quantity in values:
                        error, size = _max_error(ours[quantity], values[quantity], quantity, mask)
                        tol = validation_tolerance(hf["x"].dtype, size)
                        rows.append((layer, quantity, reference, error, tol, error <= tol))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.sort_values(["layer", "quantity", "reference"], ignore_index=True)


def validate_model(loaded: LoadedModel, text: str | None = None, *, raise_on_failure: bool = True) -> Result:
    """Compare headlens.arch.mha with HF eager, sdpa and TransformerLens on every layer.

    Returns a Result of kind "validation" (headlens.results): its frame has columns layer, quantity (pattern /
    z / attn_out), reference (hf_eager / sdpa / transformer_lens), max_abs_error, tolerance, passed; its meta
    holds `model`, `text_source` ("given", "probes.default_text()" or "builtin sentence") and `n_tokens`.
    `dtype` and `tolerance_rule` (validation_tolerance: VALIDATION_ATOL in float32, scaled to the
    epsilon of a half-precision model). Raises ValidationFailed (with the Result as `.result`) if any
    error exceeds its tolerance, unless raise_on_failure is False.
    """
    dtype = next(loaded.model.parameters()).dtype
    if dtype not in DTYPES.values():
        raise ConfigError(f"validation runs on {', '.join(DTYPES)} models (tolerances are set for those), got {dtype}")
    text, source = validation_text(text)
    batch = validation_batch(loaded, text)
    frame = compare_attention(loaded, batch)
    meta = {
        "model": str(loaded.name),
        "text_source": source,
        "n_tokens": int(batch.mask.sum()),
        "dtype": str(dtype).removeprefix("torch."),
        "tolerance_rule": tolerance_rule(dtype),
    }
    result = Result("validation", frame, meta)
    failed = frame[~frame["passed"]]
    if raise_on_failure and len(failed):
        worst = failed.loc[(failed["max_abs_error"] / failed["tolerance"]).idxmax()]
        raise ValidationFailed(
            f"{len(failed)} of {len(frame)} comparisons exceed their tolerance (worst: layer {worst.layer} "
            f"{worst.quantity} vs {worst.reference}, {worst.max_abs_error:.3g} > {worst.tolerance:.3g}; "
            f"{tolerance_rule(dtype)})",
            result=result,
        )
    return result

"""Validate the from-scratch attention (headlens.mha) against the library, layer by layer.

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
  (`blocks.{L}.attn.hook_pattern`, `hook_z`, `blocks.{L}.hook_attn_out`, via headlens.capture),
  for the families TransformerLens's bridge boots (TL_FAMILIES).
Only real (non-padding) query positions are compared.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

from headlens.arch import adapter_for, get_module
from headlens.capture import Batch, CollectPatterns, pad_batch, run_capture
from headlens.errors import ConfigError, InputTextError, ValidationFailed
from headlens.mha import CausalSelfAttention, GroupedQueryAttention
from headlens.models import LoadedModel, boot_bridge
from headlens.probes import default_text, text_windows

# Largest max-absolute-error accepted between our attention and a reference, float32 only.
# float32 has ~1.2e-7 relative precision; reordered sums over d_model <= 1600 terms stay orders of
# magnitude below 1e-5, while a real bug (wrong transpose, scale, mask) gives errors >= 1e-3.
VALIDATION_ATOL = 1e-5
# Used when no text is given and the shipped model's held-out text is absent.
BUILTIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. When Mary and John went to the store, "
    "John gave a drink to Mary, and the cat sat on the mat while the dog slept by the door."
)
WINDOW_TOKENS = 128  # tokens per validation sequence (BOS included), capped at the model's n_ctx
MAX_WINDOWS = 4  # sequences per validation batch: windows of unequal length exercise padding
COLUMNS = ["layer", "quantity", "reference", "max_abs_error", "tolerance", "passed"]
# Families whose TransformerLens 4 bridge boots offline from a config and a local model (each tried).
TL_FAMILIES = frozenset({"gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"})


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
    handles = []

    def keep(layer, key, index=None):
        def hook(module, args, output):
            value = output[index] if index is not None else output
            store.setdefault(layer, {})[key] = value.detach().clone()

        return hook

    def keep_qkv(layer):
        def fn(q, k, v):  # q [batch, head, pos, d_head]; k, v [batch, kv_head, pos, d_head]
            store.setdefault(layer, {})["qkv"] = (q.clone(), k.clone(), v.clone())

        return fn

    try:
        for layer in range(adapter.n_layers):
            norm = get_module(adapter.layer(layer), adapter.sites.input_norm)
            handles.append(norm.register_forward_hook(keep(layer, "x")))  # [batch, pos, d_model]
            attn = adapter.attn(layer)
            handles.append(attn.register_forward_hook(keep(layer, "attn_out", 0)))  # [batch, pos, d_model]
            handles += adapter.hook_qkv(layer, keep_qkv(layer))
        yield
    finally:
        for handle in handles:
            handle.remove()


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

    hooks = [(f"blocks.{layer}.hook_attn_out", keep_attn_out) for layer in range(loaded.spec.n_layers)]
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
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible,
                                                           scale=adapter.attention_scale(layer),
                                                           enable_gqa=k.shape[1] < q.shape[1])
    z = out.transpose(1, 2)  # [batch, head, pos, d_head] -> [batch, pos, head, d_head]
    return {"z": z, "attn_out": adapter.z_module(layer)(z.reshape(batch, pos, -1))}  # attn_out [batch, pos, d_model]


def our_attention(model, layer: int) -> torch.nn.Module:
    """headlens.mha's attention holding `layer`'s weights."""
    adapter = adapter_for(model)
    if adapter.family == "gpt2":
        return CausalSelfAttention.from_gpt2(adapter.attn(layer), model.config, layer)
    return GroupedQueryAttention(adapter.attention_weights(layer)).eval()


def _max_error(ours: torch.Tensor, ref: torch.Tensor, quantity: str, mask: torch.Tensor) -> float:
    """Max |ours - ref| over real query positions (mask [batch, pos])."""
    diff = (ours.float() - ref.float()).abs()
    if quantity == "pattern":
        diff = diff.transpose(1, 2)  # [batch, head, q_pos, k_pos] -> [batch, q_pos, head, k_pos]
    return float(diff[mask].max())  # over [n_real, ...]


def compare_attention(loaded: LoadedModel, batch: Batch) -> pd.DataFrame:
    """Run the comparison on one right-padded batch; one row per layer x quantity x reference."""
    model = loaded.model
    mask = batch.mask.to(next(model.parameters()).device)  # [batch, pos]
    adapter = adapter_for(model)
    references = {"hf_eager": _capture_hf(model, batch)}
    if adapter.family in TL_FAMILIES:
        references["transformer_lens"] = _capture_bridge(loaded, batch)
    rows = []
    with torch.no_grad():
        for layer in range(loaded.spec.n_layers):
            hf = references["hf_eager"][layer]
            ours = our_attention(model, layer)(hf["x"], attention_mask=mask)._asdict()  # x [batch, pos, d_model]
            refs = {**{name: found[layer] for name, found in references.items()},
                    "sdpa": _sdpa_reference(adapter, layer, hf["qkv"], mask)}
            for reference, values in refs.items():
                for quantity in ("pattern", "z", "attn_out"):
                    if quantity in values:
                        error = _max_error(ours[quantity], values[quantity], quantity, mask)
                        rows.append((layer, quantity, reference, error, VALIDATION_ATOL, error <= VALIDATION_ATOL))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.sort_values(["layer", "quantity", "reference"], ignore_index=True)


def validate_model(loaded: LoadedModel, text: str | None = None, *, raise_on_failure: bool = True) -> pd.DataFrame:
    """Compare headlens.mha with HF eager, sdpa and TransformerLens on every layer.

    Returns a DataFrame with columns layer, quantity (pattern / z / attn_out), reference
    (hf_eager / sdpa / transformer_lens), max_abs_error, tolerance, passed; `frame.attrs` holds
    `text_source` ("given", "probes.default_text()" or "builtin sentence") and `n_tokens`.
    Raises ValidationFailed (with the frame as `.frame`) if any error exceeds VALIDATION_ATOL,
    unless raise_on_failure is False. The model must be float32 (the tolerance is float32's).
    """
    dtype = next(loaded.model.parameters()).dtype
    if dtype != torch.float32:
        raise ConfigError(f"validation needs a float32 model (VALIDATION_ATOL={VALIDATION_ATOL:g} is for float32), "
                          f"got {dtype}")
    text, source = validation_text(text)
    batch = validation_batch(loaded, text)
    frame = compare_attention(loaded, batch)
    frame.attrs.update(text_source=source, n_tokens=int(batch.mask.sum()))
    failed = frame[~frame["passed"]]
    if raise_on_failure and len(failed):
        worst = failed.loc[failed["max_abs_error"].idxmax()]
        raise ValidationFailed(
            f"{len(failed)} of {len(frame)} comparisons exceed {VALIDATION_ATOL:g} (worst: layer {worst.layer} "
            f"{worst.quantity} vs {worst.reference}, {worst.max_abs_error:.3g})",
            frame=frame,
        )
    return frame

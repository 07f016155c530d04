"""The real GGUF models (`make models`): the dequantizer on their own tensors, the pulled files'
sha256, conversion into the cache, and greedy completions that show the weights survived."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from headlens.load.cache import file_sha256
from headlens.load.dequant import dequantize
from headlens.load.gguf_read import read_gguf
from headlens.load.pulls import NAMED_MODELS

pytestmark = pytest.mark.real
PROMPT = "The capital of Italy is"


@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_dequantizer_matches_gguf_on_every_type_of_the_file(pulled, name):
    parsed = read_gguf(pulled(name))
    first_of_type = {}
    for tensor in parsed.tensors:
        first_of_type.setdefault(tensor.ggml_type, tensor)
    for ggml_type, tensor in first_of_type.items():
        rows = tensor.data[:64] if tensor.data.ndim > 1 else tensor.data  # [row, row_bytes]
        ours = dequantize(rows, ggml_type)
        reference = gguf.quants.dequantize(np.array(rows), gguf.GGMLQuantizationType(ggml_type))
        tolerance = 4 * np.finfo(np.float32).eps * np.abs(reference).max()
        np.testing.assert_allclose(ours, reference.astype(np.float32), rtol=0, atol=tolerance, err_msg=tensor.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_pulled_file_has_the_pinned_sha256(pulled, name):
    assert file_sha256(pulled(name)) == NAMED_MODELS[name].sha256


def complete(model, tokenizer, prompt: str = PROMPT, n: int = 2) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, pos]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.slow
def test_smollm2_loads_and_knows_rome(pulled):
    from headlens.load.models import load_model

    pulled("smollm2")
    loaded = load_model("smollm2")
    assert loaded.source.quantization == "Q4_1" and loaded.display_name == "smollm2"
    spec = loaded.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (30, 9, 3, 64)
    assert complete(loaded.model, loaded.tokenizer).startswith(" Rome")


# GGUF name -> (Hugging Face name, value the HF weight holds given the GGUF's): Gemma stores norms as w + 1
GEMMA_CHECKED = {
    "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj.weight", lambda w: w),
    "blk.0.attn_v.weight": ("model.layers.0.self_attn.v_proj.weight", lambda w: w),
    "blk.0.attn_output.weight": ("model.layers.0.self_attn.o_proj.weight", lambda w: w),
    "blk.0.ffn_down.weight": ("model.layers.0.mlp.down_proj.weight", lambda w: w),
    "blk.0.attn_q_norm.weight": ("model.layers.0.self_attn.q_norm.weight", lambda w: w - 1),
}


@pytest.mark.slow
def test_gemma3_converts_into_the_cache(pulled):
    """Without headlens's Gemma 3 adapter: the cached float folder holds, under transformers' names,
    what gguf's numpy reference decodes from the file (Q5_0, Q8_0, Q4_K, Q6_K and an F32 norm)."""
    from safetensors import safe_open

    from headlens.load.locate import gguf_folder

    path = pulled("gemma3-270m")
    folder, source = gguf_folder(path, NAMED_MODELS["gemma3-270m"].sha256)
    assert source.quantization == "Q4_K_M"
    tensors = {t.name: t for t in read_gguf(path).tensors}
    with safe_open(str(folder / "model.safetensors"), framework="np") as weights:
        for gguf_name, (hf_name, transform) in GEMMA_CHECKED.items():
            tensor = tensors[gguf_name]
            reference = transform(
                gguf.quants.dequantize(np.array(tensor.data), gguf.GGMLQuantizationType(tensor.ggml_type))
            )
            tolerance = 4 * np.finfo(np.float32).eps * np.abs(reference).max()
            np.testing.assert_allclose(
                weights.get_tensor(hf_name), reference, rtol=0, atol=tolerance, err_msg=gguf_name
            )


@pytest.mark.slow
def test_gemma3_loads_through_headlens(pulled):
    from headlens.load.models import load_model

    pulled("gemma3-270m")
    loaded = load_model("gemma3-270m")
    assert loaded.source.quantization == "Q4_K_M"
    assert (loaded.spec.n_layers, loaded.spec.n_heads, loaded.spec.n_kv_heads, loaded.spec.d_head) == (18, 4, 1, 256)
    # Gemma 3 270M is a small base model: after the bare prompt it continues " the capital of" (" Rome" ranks
    # 4th), so it is given one worked example first, as a few-shot prompt.
    prompt = "The capital of France is Paris. " + PROMPT
    assert complete(loaded.model, loaded.tokenizer, prompt).startswith(" Rome")


# Texts with what tokenizers trip on: leading and repeated spaces, newlines, tabs, accents, CJK, digits.
TOKENIZER_TEXTS = ["The capital of Italy is", " leading space", "two  spaces\n\n\tand a tab", "ünïcödé 東京 12345", ""]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_converted_tokenizer_gives_autotokenizers_ids(pulled, name):
    """The fast path (the converted folder's tokenizer.json read directly) against transformers'
    AutoTokenizer on the same folder: the same ids, BOS included, and the same special tokens."""
    from transformers import AutoTokenizer

    from headlens.load.models import converted_tokenizer, resolve_model

    pulled(name)
    folder, source, _ = resolve_model(name)
    assert source is not None
    ours, peer = converted_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    for text in TOKENIZER_TEXTS:
        assert ours(text)["input_ids"] == peer(text)["input_ids"], text
    assert (ours.bos_token_id, ours.eos_token_id, len(ours)) == (peer.bos_token_id, peer.eos_token_id, len(peer))

"""The site tables (headlens.arch.sites): complete, pointing at the modules the Hugging Face
families really have, with split rules checked on tensors built so that each element names the
part, head and dimension it belongs to."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from headlens.arch import adapter_for
from headlens.arch.gpt2 import GPT2Adapter
from headlens.arch.llama import LLAMA_SITES
from headlens.arch.mistral import MistralAdapter
from headlens.arch.qwen import Qwen2Adapter, Qwen3Adapter
from headlens.arch.sites import FUSED, FUSED_HEADS, HEADS, INPUT, NORMED, OUTPUT, Split, to_heads
from tests.helpers.families import FAMILY_NAMES, build_family, o_proj

BATCH, POS, HEADS_N, D_HEAD, PARTS = 2, 3, 4, 5, 3


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request):
    return build_family(request.param)


def _rows(sites):
    return {"q": sites.q, "k": sites.k, "v": sites.v, "z": sites.z, "o": sites.o}


def test_every_row_names_a_module_of_every_layer(family):
    adapter = adapter_for(family.model)
    for layer in range(adapter.n_layers):
        for name, row in _rows(adapter.sites).items():
            assert isinstance(adapter.site_module(layer, row), torch.nn.Module), name
        assert adapter.z_module(layer) is o_proj(family.model, layer)  # found from HF's names directly
    assert adapter.sites.z.hook == INPUT and adapter.sites.o.hook == OUTPUT
    assert adapter.sites.z.module == adapter.sites.o.module  # z is the output projection's input


def test_gpt2_table(small_model):
    adapter = adapter_for(small_model.model)
    config = small_model.model.config
    assert isinstance(adapter, GPT2Adapter)
    assert (adapter.n_heads, adapter.d_model, adapter.n_ctx) == (config.n_head, config.n_embd, config.n_positions)
    assert adapter.z_module(1) is small_model.model.transformer.h[1].attn.c_proj
    assert adapter.sites.rotary is None and adapter.sites.rotary_emb is None
    assert adapter.context(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool)).extra == {}


def test_the_rotary_function_is_the_familys_own(family):
    adapter = adapter_for(family.model)
    modeling = sys.modules[type(adapter.attn(0)).__module__]
    assert adapter.sites.rotary is modeling.apply_rotary_pos_emb


def test_variants_are_llamas_table_with_their_differences():
    def changed(sites):
        return {f.name for f in dataclasses.fields(sites) if getattr(sites, f.name) != getattr(LLAMA_SITES, f.name)}

    assert changed(MistralAdapter.sites) == {"rotary"}
    assert changed(Qwen2Adapter.sites) == {"rotary"}
    assert changed(Qwen3Adapter.sites) == {"rotary", "q", "k"}
    assert Qwen3Adapter.sites.q.split.kind == NORMED and Qwen3Adapter.sites.q.projection == "self_attn.q_proj"


def _labelled(shape_names: tuple[str, ...], sizes: dict[str, int]) -> torch.Tensor:
    """A tensor whose element at index (i, j, ...) is sum(index * 10**place) over the names, so
    each element says which (batch, pos, part, head, dim) it is."""
    places = {"batch": 4, "pos": 3, "part": 2, "head": 1, "dim": 0}
    grids = torch.meshgrid(*[torch.arange(sizes[n]) for n in shape_names], indexing="ij")
    return sum(g * 10 ** places[n] for g, n in zip(grids, shape_names, strict=True)).double()


@pytest.mark.parametrize(
    "kind, layout",
    [
        (HEADS, ("batch", "pos", "head", "dim")),
        (NORMED, ("batch", "pos", "head", "dim")),
        (FUSED, ("batch", "pos", "part", "head", "dim")),
        (FUSED_HEADS, ("batch", "pos", "head", "part", "dim")),
    ],
)
def test_split_rules_put_each_element_at_its_head(kind, layout):
    sizes = {"batch": BATCH, "pos": POS, "part": PARTS, "head": HEADS_N, "dim": D_HEAD}
    full = _labelled(layout, sizes)
    hooked = full if kind == NORMED else full.reshape(BATCH, POS, -1)  # what the hook sees
    for part in range(PARTS if kind in (FUSED, FUSED_HEADS) else 1):
        out = to_heads(hooked, Split(kind, part=part, parts=PARTS), HEADS_N, D_HEAD)  # [batch, head, pos, d_head]
        expected = _labelled(("batch", "head", "pos", "dim"), sizes) + part * 100  # [batch, head, pos, d_head]
        assert torch.equal(out, expected)


def test_the_spec_and_the_adapter_give_the_same_key_value_groups(family):
    adapter = adapter_for(family.model)
    per_group = adapter.n_heads // adapter.n_kv_heads
    expected = [h // per_group for h in range(adapter.n_heads)]  # consecutive query heads share K/V
    assert [family.spec.kv_group(h) for h in range(adapter.n_heads)] == expected
    assert [adapter.kv_group(h) for h in range(adapter.n_heads)] == expected

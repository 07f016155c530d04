"""`headlens validate` on every family: the from-scratch GroupedQueryAttention (rotary, GQA/MQA,
q/k norm, sliding window) against HF eager, sdpa (enable_gqa) and the TransformerLens bridge."""

from __future__ import annotations

import pytest
import torch

from headlens.arch import adapter_for
from headlens.errors import ValidationFailed
from headlens.validate import BUILTIN_TEXT, VALIDATION_ATOL, validate_model
from tests.helpers.families import FAMILY_NAMES, build_family

# Two windows of the families' 64-token context: a right-padded batch.
TEXT = " ".join([BUILTIN_TEXT] * 3)
PERTURBED_LAYER = 1
PERTURBATION = 0.05  # added to one input column of W_K: far above float32 noise (weights ~N(0, 0.15))

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request):
    return build_family(request.param)


def test_validation_passes_on_every_layer_against_every_reference(family):
    result = validate_model(family, TEXT)
    frame = result.frame
    assert result.meta["n_tokens"] > family.spec.n_ctx  # two windows: padding is exercised
    assert sorted(frame["layer"].unique()) == list(range(family.spec.n_layers))
    assert set(frame["reference"]) == {"hf_eager", "sdpa", "transformer_lens"}
    # per layer: 3 quantities vs hf_eager and transformer_lens, z and attn_out vs sdpa
    assert len(frame) == family.spec.n_layers * 8
    assert (frame["max_abs_error"] <= VALIDATION_ATOL).all(), frame[~frame["passed"]]


def test_validation_fails_when_one_weight_is_perturbed(family, monkeypatch):
    adapter_class = type(adapter_for(family.model))  # a RotaryAdapter, or one with its own attention_weights
    original = adapter_class.attention_weights

    def perturbed(self, layer):
        weights = original(self, layer)
        if layer == PERTURBED_LAYER:
            weights.w_k = weights.w_k.detach().clone()
            weights.w_k[:, 0] += PERTURBATION  # input feature 0 into every key unit
        return weights

    monkeypatch.setattr(adapter_class, "attention_weights", perturbed)
    with pytest.raises(ValidationFailed) as info:
        validate_model(family, TEXT)
    frame = info.value.frame
    failed = frame[~frame["passed"]]
    assert set(failed["layer"]) == {PERTURBED_LAYER}
    assert set(failed["reference"]) == {"hf_eager", "sdpa", "transformer_lens"}
    assert set(failed["quantity"]) == {"pattern", "z", "attn_out"}
    assert torch.isfinite(torch.tensor(frame["max_abs_error"].to_numpy())).all()


def test_validate_command_on_a_grouped_query_model(tmp_path):
    import json

    from click.testing import CliRunner

    from headlens.cli.main import cli
    from headlens.load.models import save_model

    directory = save_model(build_family("qwen3-mqa"), tmp_path / "qwen3")
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", str(directory), "--text", str(text), "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["passed"] and {row["reference"] for row in payload["rows"]} == {
        "hf_eager",
        "sdpa",
        "transformer_lens",
    }

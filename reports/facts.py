"""What a command that writes no page borrows from the report, in words, numbers and pandas only (no drawing
code, so such a command never loads matplotlib): a model's shape facts (`model_info`, in every output file's
header and the report's), and the validation's sentence and summary table (`identical_note`,
`validation_summary`, in the report's validation section and `headlens validate`'s table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from headlens.reports.i18n import DEFAULT_LANG, t

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel


def identical_note(validation: pd.DataFrame, lang: str = DEFAULT_LANG) -> str:
    """Which references agree bit for bit (max error exactly 0 on every row) and why, and which comparison
    is independent (sdpa)."""
    if not {"reference", "max_abs_error"} <= set(validation.columns):
        return ""
    zero = validation.groupby("reference", sort=True)["max_abs_error"].apply(lambda errors: bool((errors == 0).all()))
    identical = [reference for reference, exact in zero.items() if exact]
    if not identical:
        return t("validation.independent", lang)
    others = [reference for reference, exact in zero.items() if not exact]
    return t("validation.identical", lang, refs=", ".join(identical), others=", ".join(others) or "-")


def validation_summary(validation: pd.DataFrame) -> pd.DataFrame | None:
    """One row per quantity and reference: the layers compared, the largest error and its tolerance, whether
    every layer passed; None for a frame without those columns."""
    needed = {"layer", "quantity", "reference", "max_abs_error", "tolerance", "passed"}
    if not needed <= set(validation.columns):
        return None
    grouped = validation.groupby(["quantity", "reference"], sort=False)
    worst = validation.loc[grouped["max_abs_error"].idxmax()]
    return pd.DataFrame(
        {
            "quantity": worst["quantity"].to_numpy(),
            "reference": worst["reference"].to_numpy(),
            "layers": grouped["layer"].nunique().to_numpy(),
            "max_abs_error": worst["max_abs_error"].to_numpy(),
            "tolerance": worst["tolerance"].to_numpy(),
            "passed": grouped["passed"].all().to_numpy(),
        }
    )


def model_info(loaded: LoadedModel) -> dict:
    """The shape facts a report and an output file describe a model by."""
    spec = loaded.spec
    source = getattr(loaded, "source", None)  # a GGUF: "dequantized from Q4_1" in the report
    quantization = {"source_format": source.format, "quantization": source.quantization} if source else {}
    return {
        "name": str(loaded.name),
        "display_name": getattr(loaded, "display_name", str(loaded.name)),
        **quantization,
        "family": spec.family,
        "n_layers": spec.n_layers,
        "n_heads": spec.n_heads,
        "n_kv_heads": spec.n_kv_heads or spec.n_heads,
        "d_head": spec.d_head,
        "d_model": spec.d_model,
        "n_ctx": spec.n_ctx,
        "n_params": spec.n_params,
    }

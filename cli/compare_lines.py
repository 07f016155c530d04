"""What `headlens classify --compare-texts` prints: per role, a block of short lines that fits the terminal.

A role's block opens with its Jaccard overlap across the texts and the heads that flip, then one line per
text with the heads labelled on it (wrapped to the width, continuation lines indented under the heads),
then each flipping head's ranking score on every text beside the role's cut-off.
"""

from __future__ import annotations

import shutil
import textwrap

import pandas as pd

MIN_WIDTH = 60  # narrower terminals still get lines this wide rather than one head per line


def compare_lines(table: pd.DataFrame, texts: list[str], width: int | None = None) -> list[str]:
    """The lines for headlens.classify.compare.compare_labels' `table` over `texts` (in their order),
    wrapped at `width` columns (the terminal's when None)."""
    width = max(MIN_WIDTH, width or shutil.get_terminal_size((100, 24)).columns)
    name_width = max(len(name) for name in texts)
    header = f"labels on {len(texts)} texts: {', '.join(texts)}; Jaccard = heads on every text / heads on any"
    lines = _wrapped("", header, width)
    for row in table.to_dict("records"):
        flips = ", ".join(row["flips"]) or "none"
        lines += ["", *_wrapped(f"{row['role']}: Jaccard {row['jaccard']:.2f}; flips: ", flips, width)]
        for name in texts:
            heads = row[f"heads_{name}"]
            lead = f"  {name:<{name_width}} {len(heads):>3}  "
            lines += _wrapped(lead, ", ".join(heads) or "-", width)
        if row["flip_scores"]:
            lead = f"  scores ({'/'.join(texts)}): "
            lines += _wrapped(lead, "; ".join(row["flip_scores"]), width)
    return lines


def _wrapped(lead: str, text: str, width: int) -> list[str]:
    """`lead` then `text`, wrapped at `width`, later lines indented to where the text starts."""
    return textwrap.wrap(
        text, width=width, initial_indent=lead, subsequent_indent=" " * len(lead), break_on_hyphens=False
    )

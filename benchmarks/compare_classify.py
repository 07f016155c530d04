"""Two classifications of the same model side by side: are the labels the same, how far apart are the scores?

Reads two files `headlens classify` wrote (heads.csv or heads.json, e.g. from two checkouts'
`bench_commands.py --keep DIR` runs) and prints, per model: the heads whose labels differ (none when a
change kept every label), and every score column whose values differ, with the largest absolute
difference and the head where it is. NaN on both sides counts as equal; NaN on one side only is listed.

    python benchmarks/compare_classify.py OLD/heads.csv NEW/heads.csv
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from headlens.classify.cache import read_classification


def compare(old, new) -> tuple[list[str], list[tuple[str, float, str]]]:
    """(heads whose labels differ, as "layer.head: old -> new"; (column, max |difference|, head) of every
    numeric column whose values differ)."""
    if list(zip(old["layer"], old["head"], strict=True)) != list(zip(new["layer"], new["head"], strict=True)):
        raise SystemExit("the two files do not list the same heads")
    labels = [
        f"{layer}.{head}: {a} -> {b}"
        for layer, head, a, b in zip(old["layer"], old["head"], old["labels"], new["labels"], strict=True)
        if sorted(a) != sorted(b)
    ]
    columns = []
    for column in old.columns:
        if column not in new.columns or not pd.api.types.is_numeric_dtype(old[column]):
            continue
        a, b = old[column].to_numpy(float), new[column].to_numpy(float)
        nan_mismatch = np.isnan(a) != np.isnan(b)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        diff = np.where(nan_mismatch, np.inf, diff)
        if diff.max() > 0:
            where = int(diff.argmax())
            columns.append((column, float(diff.max()), f"{old['layer'][where]}.{old['head'][where]}"))
    return labels, columns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="heads.csv or heads.json of the old code")
    parser.add_argument("new", help="the same from the new code")
    args = parser.parse_args(argv)
    old, new = read_classification(args.old), read_classification(args.new)
    labels, columns = compare(old, new)
    print(f"{len(old)} heads; labels differ on {len(labels)}")
    for line in labels:
        print("  " + line)
    print(f"score columns that differ: {len(columns)}")
    for column, diff, head in columns:
        print(f"  {column}: max |old - new| = {diff:.3g} (head {head})")
    return 1 if labels else 0


if __name__ == "__main__":
    sys.exit(main())

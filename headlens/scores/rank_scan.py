"""How many entries of a row lie strictly above its own entry, counted over a whole vocabulary on a
bfloat16 screen with float32 checks where the screen cannot tell: the scan behind
headlens.scores.qk_vocab.own_in_top (a query against every key) and headlens.scores.ov_rows.product_rows
(a head's logits -z W_O W_U for many rows).

A row is a vector x [d] (float32: a query, or a head's value z); the columns c_j [d] are a [d, n]
matrix (a key head's keys transposed, or W_O W_U). The row's own entry e = x . c_own is float32
(elementwise products summed); an entry counts when it is strictly above e in float32, and the own
column never counts.

Each block of columns is first scored from x and c rounded to bfloat16: on CPUs with AVX512-BF16 that
product runs faster than float32's at the scan's shapes (benchmarks/bench_rank_scan.py; figures in
BENCHMARKS.md). Where the CPU has neither AVX512-BF16 nor AMX, bfloat16 products would be emulated,
so the screen is float32 there (SCREEN_DTYPE): the same margin, the same counts. The screened entry
s_j errs from x . c_j by at most

    3 u (1 + u)^3 sum_i |x_i| |c_ij|  +  gamma_d (1 + u)^2 sum_i |x_i| |c_ij|  <=  0.0139 |x| |c_j|

with u = 2^-8, bfloat16's unit roundoff (rounding x and c: 2u + u^2 per product, and products of
bfloat16 numbers are exact in float32; the sum rounded to bfloat16: u), gamma_d = d 2^-24 / (1 - d 2^-24)
for the float32 accumulation (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.5;
<= 2^-10 for d <= MAX_D) and Cauchy-Schwarz for the sum. A float32 entry errs from x . c_j by at most
gamma_d |x| |c_j| more. The columns go by increasing norm, and a block's margin for a row is MARGIN |x|
times the block's largest |c_j|, MARGIN = 2^-6 = 0.0156 >= 0.0139 + 2^-10: a screened entry above the
own entry plus the margin is above it in float32 too, one below the own entry less the margin is below
it (the thresholds are rounded outward from float64, so the comparison adds no error). An entry
within the margin is computed again in float32, elementwise, or, for a row with more than FULL such
entries in a block, by a float32 product of the row with the whole block; either way a near-tie within
float32's rounding (gamma_d |x| |c_j|) falls as that float32 computation puts it.
tests/test_rank_scan.py checks the bound against float64 on adversarial rows: a CPU whose bfloat16
product accumulated in bfloat16 fails it.

The margin is relative to |x| |c_j|, so the screen decides most entries only where a row's entries
spread by more than a few percent of |x| |c_j|: so they do for Gemma 3 270M's queries against keys and
its values against W_O W_U, not for z W_O against W_U in the residual basis (BENCHMARKS.md), which is
why headlens.scores.ov_rows scans few rows there in float32.

A row leaves the scan once `limit` entries lie above its own (the count is then at least the limit).
A row that stays under it, a hit of the criterion, is scanned to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MARGIN = 2.0**-6  # screened entries within MARGIN |x| |c_j| of the own entry are checked in float32
BLOCK = 8192  # columns per step of a scan ([rows, BLOCK] bfloat16 entries: 4 MB at 256 rows)
ROWS = 256  # rows per pass of a scan
CHECK = 65536  # entries per float32 check ([CHECK, d] float32 gathered columns)
FULL = 256  # a row with more open entries in a block is checked by one float32 product with the block
MAX_D = 16384  # MARGIN covers float32 accumulation over at most this many terms


def _screen_dtype() -> torch.dtype:
    """bfloat16 where the CPU multiplies it natively (AVX512-BF16 or AMX tiles), else float32."""
    native = [
        getattr(torch.cpu, name, lambda: False) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    return torch.bfloat16 if any(check() for check in native) else torch.float32


SCREEN_DTYPE = _screen_dtype()


@dataclass(frozen=True)
class Columns:
    """The columns as a scan reads them: `exact` [d, n] float32 in their own order; `order` [n] the
    columns by increasing norm and `place` [n] each column's position there; `rounded` [d, n]
    (SCREEN_DTYPE) and `norm` [n] float32 (each column's Euclidean norm, rounded up) in that order, so
    that a block's largest norm bounds its columns' closely."""

    exact: torch.Tensor
    order: torch.Tensor
    place: torch.Tensor
    rounded: torch.Tensor
    norm: torch.Tensor

    @property
    def n(self) -> int:
        return self.exact.shape[1]


def columns(matrix: torch.Tensor) -> Columns:
    """Columns of matrix [d, n] (any float dtype, any layout: a transposed [n, d] tensor stays one)."""
    if matrix.shape[0] > MAX_D:
        raise ValueError(f"rank_scan covers vectors of at most {MAX_D} entries, not {matrix.shape[0]}")
    exact = matrix.float()  # [d, n]
    norm = torch.cat([part.double().norm(dim=0) for part in exact.split(4096, dim=1)])  # [n] float64
    order = norm.argsort()  # [n]
    place = torch.empty_like(order).scatter_(0, order, torch.arange(len(order)))  # [n]
    rounded = exact.T[order].to(SCREEN_DTYPE).T  # [d, n]: gathered as rows, fast for a transposed [n, d] matrix
    return Columns(exact, order, place, rounded, _rounded(norm[order], up=True))


def _check(x, cols: Columns, mine, counts, rows_at: torch.Tensor, ids: torch.Tensor, open_: torch.Tensor) -> None:
    """Count in float32 the entries the screen left open: open_ [s, b] over rows rows_at [s] of x and the
    block's columns ids [b]; adds to counts [m] in place. A row with more than FULL open entries meets
    the block in one float32 product, the others entry by entry (entries)."""
    many = open_.sum(-1) > FULL  # [s]
    if many.any():
        rows = many.nonzero().flatten()  # [f]
        exact = x[rows_at[rows]] @ cols.exact[:, ids]  # [f, b] float32
        counts[rows_at[rows]] += ((exact > mine[rows_at[rows], None]) & open_[rows]).sum(-1)
        open_[rows] = False
    rows, at = open_.nonzero(as_tuple=True)  # [p] each
    for start in range(0, len(rows), CHECK):
        r, j = rows_at[rows[start : start + CHECK]], ids[at[start : start + CHECK]]  # [p'] each
        counts.index_add_(0, r, (entries(x[r], cols, j) > mine[r]).long())


def _rounded(values: torch.Tensor, up: bool) -> torch.Tensor:
    """float64 values [m] to float32, rounded up (or down): never below (above) the float64 value."""
    out = values.float()  # [m]
    wrong = out.double() < values if up else out.double() > values  # [m]
    return torch.where(wrong, torch.nextafter(out, torch.tensor(torch.inf if up else -torch.inf)), out)


def entries(x: torch.Tensor, cols: Columns, ids: torch.Tensor) -> torch.Tensor:
    """x_r . c_{ids_r} in float32, products summed elementwise: x [m, d] float32, ids [m] -> [m]."""
    return (x * cols.exact[:, ids].T).sum(-1)  # [m, d] -> [m]


def count_above(x: torch.Tensor, cols: Columns, own: torch.Tensor, limit: int, block: int = BLOCK) -> torch.Tensor:
    """For each row x_r (x [m, d] float32), how many columns other than own_r (own [m], column ids) have
    x_r . c_j strictly above x_r . c_{own_r}, both in float32 (module docstring): [m] int64, exact below
    `limit`; a row that reaches the limit leaves the scan with a count >= limit."""
    parts = zip(x.split(ROWS), own.split(ROWS), strict=True)  # [<= ROWS, d], [<= ROWS]
    return torch.cat([_count_rows(part, cols, ids, limit, block) for part, ids in parts])


def _count_rows(x: torch.Tensor, cols: Columns, own: torch.Tensor, limit: int, block: int) -> torch.Tensor:
    """count_above for at most ROWS rows. The columns go by increasing norm; a block's margin is each
    row's MARGIN |x| times the block's largest norm, and a screened entry above the row's own entry
    plus that margin counts, one within the margin either way is checked in float32."""
    mine = entries(x, cols, own)  # [m]
    reach = MARGIN * x.double().norm(dim=-1)  # [m] float64
    rounded, place = x.to(cols.rounded.dtype), cols.place[own]  # [m, d], [m]: the own columns' positions
    counts = torch.zeros(len(x), dtype=torch.long)  # [m]
    live = torch.arange(len(x))  # [l]: rows still open
    for first in range(0, cols.n, block):
        width, ids = min(block, cols.n - first), cols.order[first : first + block]  # ids [b]: the block's columns
        part = rounded if len(live) == len(x) else rounded[live]  # [l, d]
        screened = part @ cols.rounded[:, first : first + width]  # [l, b] SCREEN_DTYPE
        margin = reach[live] * float(cols.norm[first + width - 1])  # [l] float64
        low = _rounded(mine[live].double() - margin, up=False)  # [l]
        inside = ((place[live] >= first) & (place[live] < first + width)).nonzero().flatten()  # own column here
        screened[inside, place[live[inside]] - first] = -torch.inf  # never counts, never checked
        busy = (screened.amax(-1) >= low).nonzero().flatten()  # [s]: rows with an entry not certainly below
        if len(busy):
            rows_at = live[busy]  # [s]
            high = _rounded(mine[rows_at].double() + margin[busy], up=True)  # [s]
            near = screened[busy]  # [s, b]
            above = near > high[:, None]  # [s, b]
            counts[rows_at] += above.sum(-1)
            open_ = (near >= low[busy, None]) & ~above & (counts[rows_at] < limit)[:, None]  # [s, b]: to check
            _check(x, cols, mine, counts, rows_at, ids, open_)
        live = live[counts[live] < limit]  # [l']
        if not len(live):
            break
    return counts

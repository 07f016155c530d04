"""headlens.scores.rank_scan: the bfloat16 screen's error bound against float64 (and that a bfloat16
accumulator would break it), and count_above against counts written here in float64 and in integers,
through every path of the scan (screen only, entry checks in one or many chunks, whole-block checks)."""

from __future__ import annotations

import pytest
import torch

from headlens.scores import rank_scan

BOUND = 0.0139  # the module docstring's bound on the screen's error, over |x| |c_j|
LIMIT = 10


def adversarial(n: int, d: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [n, d] and one column c [d] whose products are large and cancel: the first half of
    x_i c_i positive, the second negative, each of magnitude ~1-2, plus float32 noise in every digit."""
    c = torch.rand(d, generator=gen) + 1.0  # [d]
    x = torch.rand(n, d, generator=gen) + 1.0  # [n, d]
    x[:, d // 2 :] *= -1
    return x, c


def test_the_screen_stays_within_its_bound_and_a_bfloat16_sum_would_not():
    assert rank_scan.MARGIN >= BOUND + 2.0**-10  # the margin covers the bound and a float32 entry's error
    gen = torch.Generator().manual_seed(0)
    for d in (64, 640, 2048):
        x, c = adversarial(256, d, gen)
        gauss_x, gauss_c = torch.randn(256, d, generator=gen), torch.randn(d, 512, generator=gen)
        for rows, cols in ((x, c[:, None]), (gauss_x, gauss_c)):
            screened = (rows.bfloat16() @ cols.bfloat16()).double()  # [n, m]: as the scan computes it
            exact = rows.double() @ cols.double()  # [n, m]
            scale = rows.double().norm(dim=-1, keepdim=True) * cols.double().norm(dim=0)  # [n, m]
            assert bool(((screened - exact).abs() <= BOUND * scale).all())
    # The same rows summed in bfloat16, one product at a time, break the bound: the test above fails on
    # a CPU whose bfloat16 product keeps its running sum in bfloat16.
    x, c = adversarial(256, 640, gen)
    products = (x.bfloat16().float() * c.bfloat16().float()).bfloat16()  # [n, d]: exact products, rounded
    running = torch.zeros(len(x), dtype=torch.bfloat16)  # [n]
    for i in range(x.shape[1]):
        running = running + products[:, i]  # [n] bfloat16
    exact = x.double() @ c.double()  # [n]
    assert bool(((running.double() - exact).abs() > BOUND * x.double().norm(dim=-1) * c.double().norm()).any())


def float64_counts(x: torch.Tensor, cols: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Columns other than own strictly above the own entry, from float64 products of the float32 values."""
    entries = x.double() @ cols.double()  # [m, n]
    mine = entries.gather(-1, own[:, None])  # [m, 1]
    entries.scatter_(-1, own[:, None], -torch.inf)
    return (entries > mine).sum(-1)  # [m]


def leaning_rows(gen, m: int, d: int, n: int, common: float = 0.0):
    """Rows x [m, d] leaning on their own columns (own [m]) of cols [d, n] by seeded random amounts, so
    that the counts fall on both sides of LIMIT. With `common`, every column and row also carries
    common sqrt(d) along one direction the columns do not vary in: the entries of a row shift alike
    and spread by ~1 / common^2 of |x| |c_j|, so the screen leaves most of them open."""
    direction = torch.randn(d, generator=gen)
    direction /= direction.norm()  # [d]
    off = torch.eye(d) - direction[:, None] * direction[None]  # [d, d]: projection off the direction
    varying = off @ torch.randn(d, n, generator=gen)  # [d, n]
    shared = common * d**0.5 * direction  # [d]
    own = torch.randperm(n, generator=gen)[:m]  # [m]
    lean = torch.rand(m, 1, generator=gen) * 0.7  # [m, 1]
    x = lean * varying[:, own].T + torch.randn(m, d, generator=gen) @ off + shared  # [m, d]
    return x, varying + shared[:, None], own


@pytest.mark.parametrize("full, check", [(rank_scan.FULL, rank_scan.CHECK), (0, rank_scan.CHECK), (10**9, 3)])
@pytest.mark.parametrize("common", [0.0, 8.0])
@pytest.mark.parametrize("screen", [torch.bfloat16, torch.float32])  # float32: CPUs without native bfloat16
def test_count_above_equals_a_float64_count(full, check, common, screen, monkeypatch):
    monkeypatch.setattr(rank_scan, "SCREEN_DTYPE", screen)
    monkeypatch.setattr(rank_scan, "FULL", full)  # 0: every open row checked by a block product
    monkeypatch.setattr(rank_scan, "CHECK", check)  # 3: entry checks in many chunks
    gen = torch.Generator().manual_seed(1)
    m, d, n, block = rank_scan.ROWS + 40, 32, 3 * 512 + 77, 512  # two row passes, a partial last block
    x, cols, own = leaning_rows(gen, m, d, n, common)
    want = float64_counts(x, cols, own)  # [m]
    got = rank_scan.count_above(x, rank_scan.columns(cols), own, LIMIT, block)  # [m]
    under = want < LIMIT
    assert under.sum() >= 20 and (~under).sum() >= 20  # both outcomes, enough of each
    assert torch.equal(got[under], want[under])  # exact under the limit
    assert bool((got[~under] >= LIMIT).all())


def test_the_screen_decides_most_entries_when_rows_spread_and_few_when_they_do_not(monkeypatch):
    checked = []
    entries = rank_scan.entries

    def spy(x, cols, ids):
        checked.append(len(ids))
        return entries(x, cols, ids)

    monkeypatch.setattr(rank_scan, "entries", spy)
    monkeypatch.setattr(rank_scan, "FULL", 10**9)
    gen = torch.Generator().manual_seed(2)
    share = []
    for common in (0.0, 8.0):
        checked.clear()
        x, cols, own = leaning_rows(gen, 64, 32, 4096, common)
        rank_scan.count_above(x, rank_scan.columns(cols), own, 10**9, 512)  # no row leaves: every entry met
        share.append((sum(checked) - 2 * len(x)) / (len(x) * 4096))  # less each row's own entry, twice
    assert share[0] < 0.05 < 0.5 < share[1]


@pytest.mark.parametrize("full", [rank_scan.FULL, 0])  # entry checks, block products
def test_ties_are_not_above(full, monkeypatch):
    """Integer entries (exact in bfloat16 and float32): many columns tie with the own one, including
    copies of the own column, and none of them counts."""
    monkeypatch.setattr(rank_scan, "FULL", full)
    gen = torch.Generator().manual_seed(3)
    m, d, n = 300, 6, 1500
    cols = torch.randint(-2, 3, (d, n), generator=gen).float()  # [d, n]
    own = torch.randint(0, n, (m,), generator=gen)  # [m]
    cols[:, 7] = cols[:, int(own[0])]  # a copy of row 0's own column
    x = torch.randint(-2, 3, (m, d), generator=gen).float()  # [m, d]
    want = float64_counts(x, cols, own)
    ties = (x.double() @ cols.double() == (x.double() * cols[:, own].T.double()).sum(-1, keepdim=True)).sum()
    assert int(ties) > 10 * m  # ties everywhere
    got = rank_scan.count_above(x, rank_scan.columns(cols), own, n, 256)  # limit n: every count exact
    assert torch.equal(got, want)

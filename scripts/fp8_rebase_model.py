"""v3.5's online softmax as a float64 model on the CPU: what the rebase threshold tau and P's exponent
offset cost O's accuracy once P is rounded to e4m3, how often a warp (16 rows) must rebase O, and
how often a speculative softmax (the experiment TILEATTN_SPEC_FP8, measured and removed: a block's
weights against the running max, checked after them; bench/NOTES.md) would fail its check in a
warpgroup (64 rows).

For each score distribution it prints O's relative error against exact attention of the same
(e4m3) inputs, as a multiple of the error of tests/test_fp8.py's model (P rounded against the row's
final max, the bound there being 2x), the fraction of K/V blocks past the first on which some
row of a warp moves its max (the O rescale the lazy rebase skips otherwise), and those on which
some row of a warpgroup has a weight above e4m3's 448 against the running max (the speculative
check fails), or above 2^(tau + offset), the lazy rebase's own bound, which the first build used.

    python scripts/fp8_rebase_model.py [--rows 256] [--bc 128]
"""

import argparse
import math

import torch

from tileattn.reference import round_e4m3

E4M3 = lambda x: torch.from_numpy(round_e4m3(x.numpy()))
SETTINGS = [(0, 0), (0, 8), (8, 0), (1, 7), (2, 6), (3, 5)]  # (tau, offset), log2 units
CASES = [  # name, Nk, D, scale (None: D^-0.5), spread of q and k
    ("flat, N=8192 D=128", 8192, 128, None, 1.0),
    ("flat, N=1024 D=128", 1024, 128, None, 1.0),
    ("negative scale -0.2, N=1000 D=256", 1000, 256, -0.2, 1.0),
    ("peaky (x3), N=2048 D=64", 2048, 64, None, 3.0),
    ("peaky (x4), N=4096 D=128", 4096, 128, None, 4.0),
]


def online(S, V, tau, offset, Bc):
    """O of scores S (rows, Nk; log2 units) and V by blocks of Bc keys: the row max moves only when
    a block's exceeds it by more than tau; P = 2^(S - m + offset) rounded to e4m3 for P V, l_i sums
    the unrounded P.  Returns O, the fraction of blocks (past the first) where a warp rebases, and
    those where a warpgroup's speculative check fails against 448 and against 2^(tau + offset)."""
    R = S.shape[0]
    m = torch.full((R,), -math.inf, dtype=torch.float64)
    l = torch.zeros(R, dtype=torch.float64)
    O = torch.zeros(R, V.shape[1], dtype=torch.float64)
    moved, spec_448, spec_own = [], [], []
    for j0 in range(0, S.shape[1], Bc):
        s = S[:, j0 : j0 + Bc].float().double()
        m_blk = s.amax(1)
        move = m_blk > m + tau
        m_new = torch.where(move, torch.maximum(m, m_blk), m)
        alpha = torch.where(torch.isfinite(m), torch.exp2(m - m_new), torch.zeros_like(m))
        if j0:
            moved.append(move.view(-1, 16).any(1).double().mean().item())
            top = m_blk - m + offset  # log2 of the block's largest weight against the running max
            spec_448.append((top > math.log2(448)).view(-1, 64).any(1).double().mean().item())
            spec_own.append((top > tau + offset).view(-1, 64).any(1).double().mean().item())
        m, l, O = m_new, l * alpha, O * alpha[:, None]
        P = torch.exp2(s - m[:, None] + offset).float().double()
        l += P.sum(1)
        O += E4M3(P) @ V[j0 : j0 + Bc]
    mean = lambda x: sum(x) / max(len(x), 1)
    return O / l[:, None], mean(moved), mean(spec_448), mean(spec_own)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--bc", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    for name, Nk, D, scale, spread in CASES:
        q, k = (E4M3(torch.randn(n, D, dtype=torch.float64) * spread) for n in (args.rows, Nk))
        V = E4M3(torch.randn(Nk, D, dtype=torch.float64))
        S = q @ k.T * (D**-0.5 if scale is None else scale) * math.log2(math.e)
        P = torch.exp2(S - S.amax(1, keepdim=True))
        exact = (P @ V) / P.sum(1, keepdim=True)
        model = (E4M3(P) @ V) / P.sum(1, keepdim=True)
        err = lambda O: ((O - exact).norm() / exact.norm()).item()
        cells = []
        for tau, offset in SETTINGS:
            O, moved, spec_448, spec_own = online(S, V, tau, offset, args.bc)
            cells.append(
                f"tau {tau} / offset {offset}: {err(O) / err(model):.2f}x, rebase {moved:.2f}, "
                f"speculation fails {spec_448:.3f} (against 2^(tau + offset): {spec_own:.3f})"
            )
        print(f"{name} (model error {err(model):.2e}):\n    " + "\n    ".join(cells))


if __name__ == "__main__":
    main()

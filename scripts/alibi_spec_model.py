"""Model: v3.8's block loop under causal ALiBi for one Q tile at a time (128 rows, two 64-row
warpgroups), walked left to right (the build before b971373) or from the diagonal leftwards (v3.8
since, csrc/v3_3_wgmma.cu REVERSE), with a speculative softmax gated at G (the experiment
TILEATTN_SPEC_ALIBI=G measured then; v3.8 now speculates in every head, G = infinity):
on each unmasked block after the walk's first, a head whose bias climbs at most G log2 units a
block tries the block's weights against the running max m_i, and the warpgroup's check fails if
some thread's partial row sum (32 keys of a row) passes 2^15; otherwise, and on masked blocks, the
ordinary path runs its lazy rebase (threshold 8, log2 units).  Printed per setting: the share of
warpgroup-blocks that speculate and pass (the blocks the speculation speeds up), that fail (each
costs the exponentials and S again), and that rescale O, and O's error against float64 with P
rounded to bf16 for P V (the walk and the speculation must not cost accuracy).  Scores: q, k ~ N(0, 1), scale D^-0.5,
BLOOM's slopes for 16 heads.  CPU only:

    python scripts/alibi_spec_model.py [--seqlen 8192] [--tiles 8]
"""

import argparse
import math

import torch

D, Br, Bc, TAU, BOUND = 128, 128, 128, 8.0, 2.0**15
LOG2E = math.log2(math.e)


def tile(q, k, v, slope, q0, reverse, gate):
    """(passed, failed, rescaled) warpgroup-blocks of the Q tile at rows q0 .. q0 + Br - 1, and its
    O's squared error and squared norm against float64."""
    rows = torch.arange(q0, q0 + Br)
    blocks = list(range(q0 // Bc + 1))  # causal, q0 a multiple of Bc: the last block is the diagonal's
    if reverse:
        blocks.reverse()
    m = torch.full((Br,), -math.inf, dtype=torch.float64)
    l = torch.zeros(Br, dtype=torch.float64)
    acc = torch.zeros(Br, D, dtype=torch.float64)
    thread = (torch.arange(Bc) % 8) // 2  # thread t of a quad holds keys 8i + 2t, 8i + 2t + 1
    speculate = slope * Bc * LOG2E <= gate
    counts = [0, 0, 0]
    for n, j in enumerate(blocks):
        keys = torch.arange(j * Bc, j * Bc + Bc)
        S = (q[rows] @ k[keys].T) * D**-0.5 + slope * (keys[None, :] - rows[:, None])  # natural units
        masked = keys[None, :] > rows[:, None]
        S = S.masked_fill(masked, -math.inf) * LOG2E
        m_blk = S.amax(1)
        ok = torch.zeros(2, dtype=torch.bool)
        if speculate and n > 0 and not masked.any():
            P = torch.exp2(S - m[:, None])
            partial = torch.stack([P[:, thread == t].sum(1) for t in range(4)], 1)
            ok = (partial <= BOUND).all(1).view(2, 64).all(1)  # the warpgroup's vote
            counts[0] += int(ok.sum())
            counts[1] += int((~ok).sum())
        ordinary = ~ok.repeat_interleave(64)
        move = ordinary & (m_blk > m + TAU)
        if n > 0:
            counts[2] += int(move.view(2, 64).any(1).sum())
        m_new = torch.where(move | (ordinary & torch.isinf(m)), torch.maximum(m, m_blk), m)
        alpha = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp2(m - m_new))
        P = torch.exp2(S - m_new[:, None])
        l = l * alpha + P.sum(1)
        acc = acc * alpha[:, None] + P.to(torch.bfloat16).double() @ v[keys]
        m = m_new
    S = (q[rows] @ k[: q0 + Br].T) * D**-0.5 + slope * (torch.arange(q0 + Br)[None, :] - rows[:, None])
    S = S.masked_fill(torch.arange(q0 + Br)[None, :] > rows[:, None], -math.inf)
    exact = torch.softmax(S, 1) @ v[: q0 + Br]
    return counts, ((acc / l[:, None] - exact) ** 2).sum().item(), (exact**2).sum().item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--tiles", type=int, default=8, help="Q tiles a head, spread over the sequence")
    args = p.parse_args()
    torch.manual_seed(0)
    H = 16
    slopes = [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
    q = torch.randn(args.seqlen, D, dtype=torch.float64)
    k = torch.randn(args.seqlen, D, dtype=torch.float64)
    v = torch.randn(args.seqlen, D, dtype=torch.float64)
    starts = [int(x) * Br for x in torch.linspace(1, args.seqlen // Br - 1, args.tiles)]
    for name, reverse, gate in [
        ("left to right, G = 2", False, 2.0),
        ("left to right, G = 8", False, 8.0),
        ("left to right, G = 16", False, 16.0),
        ("left to right, every head", False, math.inf),
        ("from the diagonal, every head", True, math.inf),
        ("from the diagonal, no speculation", True, -1.0),
        ("left to right, no speculation", False, -1.0),
    ]:
        total, err2, norm2 = [0, 0, 0], 0.0, 0.0
        for slope in slopes:
            for q0 in starts:
                counts, e2, n2 = tile(q, k, v, slope, q0, reverse, gate)
                total = [a + b for a, b in zip(total, counts)]
                err2, norm2 = err2 + e2, norm2 + n2
        blocks = sum(2 * (q0 // Bc) for q0 in starts) * len(slopes)  # warpgroup-blocks past each walk's first
        print(
            f"{name:36s} speculate and pass {total[0] / blocks:.3f}, fail {total[1] / blocks:.3f}, "
            f"rescale O {total[2] / blocks:.3f}; O's error {math.sqrt(err2 / norm2):.2e}"
        )


if __name__ == "__main__":
    main()

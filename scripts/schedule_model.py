"""A model of the persistent rungs' static tile schedule (csrc/common.cuh persistent_tile and
v3_3_wgmma.cu v3_3_for_my_tiles): each CTA of min(SMs, units) takes units blockIdx.x, + gridDim.x,
... (a unit: one tile, or under the causal mask two consecutive ones), a tile costing its K/V
blocks times its rows.  Prints the busiest CTA's work over the ideal (total / SMs) for the mma
suite's shapes, for v3.6's tile (128 x 128) and v3.7's (192 x 128), v3.7 in both orders of an odd
Tr: a head's middle block paired in place with the next head's longest (the first order, since
replaced) and persistent_tile's middles last.  No GPU: the numbers are the schedule's, not the kernel's.

    python scripts/schedule_model.py [--sms 132] [--window 4096]
"""

import argparse
import math

from tileattn.reference import persistent_tile


def q_block(tile: int, Tr: int, bh_count: int, causal: bool, middles_last: bool) -> tuple[int, int]:
    """(bh, q_block) of a tile index: persistent_tile's order (reference.persistent_tile), or
    without middles_last the first order, an odd Tr's middle block paired in place."""
    if middles_last or not causal:
        return persistent_tile(tile, Tr, bh_count, causal)
    bh, r = divmod(tile, Tr)
    return bh, Tr - 1 - r // 2 if r % 2 == 0 else r // 2


def makespan_over_ideal(N: int, bh_count: int, Br: int, Bc: int, causal: bool, middles_last: bool, sms: int):
    Tr = math.ceil(N / Br)

    def cost(qb: int) -> float:  # K/V blocks the tile runs, in 128-row units of work
        keys = min(N, (qb + 1) * Br) if causal else N
        return math.ceil(keys / Bc) * Br / 128

    tiles = [cost(q_block(t, Tr, bh_count, causal, middles_last)[1]) for t in range(Tr * bh_count)]
    U = 2 if causal else 1
    units = [sum(tiles[u : u + U]) for u in range(0, len(tiles), U)]
    ctas = min(sms, len(units))
    load = [sum(units[c::ctas]) for c in range(ctas)]
    return max(load) / (sum(tiles) / sms), max(load)


def window_over_ideal(N: int, bh_count: int, window: int, sms: int, Br: int = 128) -> float:
    """The variants kernel under a causal left window of `window` keys (Br = Bc = 128): the busiest
    CTA over the ideal with persistent_tile's pairs.  (A window-aware order, 1.031x in this model
    at N = 8192, W = 4096, measured within the run-to-run spread and was removed: bench/NOTES.md.)"""
    Tr, w = math.ceil(N / Br), window // Br
    cost = lambda r: min(r + 1, w + 1)  # K/V blocks Q block r runs
    tiles = [cost(q_block(t, Tr, bh_count, True, True)[1]) for t in range(Tr * bh_count)]
    units = [sum(tiles[u : u + 2]) for u in range(0, len(tiles), 2)]
    ctas = min(sms, len(units))
    return max(sum(units[c::ctas]) for c in range(ctas)) / (sum(units) / sms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--window", type=int, default=0, help="also the variants kernel under this causal window")
    a = ap.parse_args()
    if a.window:
        print("| N | B x H | pairs |")
        print("|---|---|---|")
        for N, BH in ((8192, 32), (8192, 64), (32768, 16), (4096, 128)):
            print(f"| {N} | {BH} | {window_over_ideal(N, BH, a.window, a.sms):.3f} |")
    print("| N | B | causal | v3.6 (128x128) | v3.7 (192x128) | v3.7, middles last | v3.7 / v3.6 busiest CTA |")
    print("|---|---|---|---|---|---|---|")
    for N in (1024, 2048, 4096, 8192, 32768):
        B = 32768 // N
        for causal in (False, True):
            r6, w6 = makespan_over_ideal(N, B * 16, 128, 128, causal, False, a.sms)
            r7, w7 = makespan_over_ideal(N, B * 16, 192, 128, causal, False, a.sms)
            r7m, w7m = makespan_over_ideal(N, B * 16, 192, 128, causal, True, a.sms)
            print(
                f"| {N} | {B} | {'yes' if causal else 'no'} | {r6:.3f} | {r7:.3f} | {r7m:.3f} | "
                f"{w7 / w6:.3f} / {w7m / w6:.3f} |"
            )


if __name__ == "__main__":
    main()

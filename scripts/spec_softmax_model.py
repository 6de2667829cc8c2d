"""Model: v3.3's 16-bit block loop for one head, the lazy rebase (threshold 8) against the speculative
softmax (csrc/v3_3_wgmma.cu speculative_softmax, the 16-bit default at 2^15) at three bounds on a
thread's partial row sum.  P is rounded to fp16 / bf16 before P V; printed: O's error against
float64 and the share of warp-blocks (16 rows x 128 keys) whose check fails (the kernel votes over
its warpgroup's 64 rows, so its share is higher).  q's spread makes the rows peaky
(bench/NOTES.md, "The speculative softmax").  CPU only:

    python scripts/spec_softmax_model.py
"""

import numpy as np
import torch

N, D, Bc, TAU = 2048, 128, 128, 8.0


def block_loop(q, k, v, dtype, bound=None):
    """O of the block loop; bound None: the lazy rebase alone.  Returns (O, failed warp-blocks)."""
    s = np.float32(np.log2(np.e) / np.sqrt(D))
    m = np.full(N, -np.inf, np.float32)
    l = np.zeros(N, np.float32)
    acc = np.zeros((N, D), np.float32)
    thread = (np.arange(Bc) % 8) // 2  # thread t of a quad holds columns 8i + 2t, 8i + 2t + 1
    failed = 0
    for j, c in enumerate(range(0, N, Bc)):
        S = (q @ k[c : c + Bc].T).astype(np.float32)
        ok = np.zeros(N, bool)
        if bound is not None and j > 0:  # the speculative weights, against the running max
            with np.errstate(over="ignore", invalid="ignore"):
                P_spec = np.exp2(S * s - m[:, None]).astype(np.float32)
            partial = np.stack([P_spec[:, thread == t].sum(1) for t in range(4)], 1)
            ok = np.repeat(np.all(partial <= bound, 1).reshape(-1, 16).all(1), 16)  # a warp: 16 rows
            failed += (~ok).sum() // 16
        m_blk = S.max(1) * s
        keep = (m_blk <= m + TAU) | ok  # the lazy rebase (or an accepted guess) keeps the max
        m_new = np.where(keep, m, np.maximum(m, m_blk))
        base = np.where(np.isinf(m_new), 0, m_new)
        alpha = np.where(keep, 1, np.exp2(m - base)).astype(np.float32)
        P = np.exp2(S * s - base[:, None]).astype(np.float32)
        if bound is not None and j > 0:
            P = np.where(ok[:, None], P_spec, P)
        l = l * alpha + P.sum(1)
        m = m_new
        P16 = torch.from_numpy(P).to(dtype).float().numpy()
        acc = acc * alpha[:, None] + P16 @ v[c : c + Bc]
    return acc / l[:, None], failed


def main():
    rng = np.random.default_rng(0)
    blocks = (N // Bc - 1) * N // 16
    for dtype in (torch.float16, torch.bfloat16):
        for spread in (1.0, 2.0, 3.0, 4.0, 6.0):
            cast = lambda x: torch.from_numpy(x.astype(np.float32)).to(dtype).float().numpy()  # noqa: E731
            q = cast(rng.standard_normal((N, D)) * spread)
            k, v = cast(rng.standard_normal((N, D))), cast(rng.standard_normal((N, D)))
            S = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(D)
            P = np.exp(S - S.max(1, keepdims=True))
            ref = (P / P.sum(1, keepdims=True)) @ v
            err = lambda o: np.linalg.norm(o - ref) / np.linalg.norm(ref)  # noqa: E731
            line = f"{str(dtype):15s} spread {spread}: lazy {err(block_loop(q, k, v, dtype)[0]):.3e}"
            for bound in (2**9, 2**12, 2**15):
                o, failed = block_loop(q, k, v, dtype, bound)
                line += f" | 2^{int(np.log2(bound))}: {err(o):.3e}, checks failed {failed / blocks:.1%}"
            print(line)


if __name__ == "__main__":
    main()

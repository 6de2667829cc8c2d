"""Serve a small Llama-style model with tileattn: prefill prompts of different lengths packed into
one batch (flash_attn_varlen_func), then decode new tokens one at a time over a paged KV cache
(flash_attn_with_kvcache, which appends each token's keys and values in place).  The model is
randomly initialised in plain PyTorch (no downloads); at the end the same model runs every
sequence densely with PyTorch's SDPA, fed the same tokens, and the logits are compared.

    python examples/generate.py [--batch 8] [--new-tokens 64] [--page-size 16]
"""

import argparse
import math
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

import tileattn


class Config:
    vocab, hidden, layers, heads, kv_heads, head_dim, ffn = 2048, 1024, 4, 16, 4, 64, 2816


def rms_norm(x, w, eps=1e-6):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos):
    """Rotary embedding of x (..., n, heads, head_dim) at integer positions pos (..., n)."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # (..., n, d/2)
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Model:
    def __init__(self, cfg, device, dtype, seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        w = lambda *s: (torch.randn(*s, generator=g) / math.sqrt(s[-1])).to(device, dtype)
        self.cfg, self.embed = cfg, w(cfg.vocab, cfg.hidden) * math.sqrt(cfg.hidden)
        H, Hk, D = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.layers = [
            dict(wq=w(H * D, cfg.hidden), wk=w(Hk * D, cfg.hidden), wv=w(Hk * D, cfg.hidden), wo=w(cfg.hidden, H * D),
                 w1=w(cfg.ffn, cfg.hidden), w3=w(cfg.ffn, cfg.hidden), w2=w(cfg.hidden, cfg.ffn),
                 n1=torch.ones(cfg.hidden, device=device, dtype=dtype),
                 n2=torch.ones(cfg.hidden, device=device, dtype=dtype))
            for _ in range(cfg.layers)
        ]  # fmt: skip
        self.norm, self.head = torch.ones(cfg.hidden, device=device, dtype=dtype), w(cfg.vocab, cfg.hidden)

    def forward(self, tokens, pos, attention):
        """tokens, pos: (..., n); attention(layer, q, k, v) with q (..., n, H, D), k/v (..., n, Hk, D)."""
        cfg, x = self.cfg, self.embed[tokens]
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["n1"])
            q = rope((h @ L["wq"].T).unflatten(-1, (cfg.heads, cfg.head_dim)), pos)
            k = rope((h @ L["wk"].T).unflatten(-1, (cfg.kv_heads, cfg.head_dim)), pos)
            v = (h @ L["wv"].T).unflatten(-1, (cfg.kv_heads, cfg.head_dim))
            x = x + attention(i, q, k, v).flatten(-2) @ L["wo"].T
            h = rms_norm(x, L["n2"])
            x = x + (F.silu(h @ L["w1"].T) * (h @ L["w3"].T)) @ L["w2"].T
        return rms_norm(x, self.norm) @ self.head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64, help="at least 3")
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("examples/generate.py needs a CUDA GPU (Hopper for the packed prefill)")
    cfg, dev, dt = Config(), "cuda", torch.bfloat16
    model = Model(cfg, dev, dt)
    g = torch.Generator(device="cpu").manual_seed(1)
    lens = torch.randint(16, 700, (args.batch,), generator=g).tolist()
    prompts = [torch.randint(0, cfg.vocab, (n,), generator=g).to(dev) for n in lens]
    B, page = args.batch, args.page_size

    # The paged cache: every sequence's pages (room for prompt + new tokens), in shuffled order.
    pages_per_seq = -(-(max(lens) + args.new_tokens) // page)
    order = torch.randperm(B * pages_per_seq, generator=g).to(dev, torch.int32)
    block_table = order.view(B, pages_per_seq)
    shape = (B * pages_per_seq, page, cfg.kv_heads, cfg.head_dim)
    k_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(cfg.layers)]
    v_cache = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(cfg.layers)]

    # Prefill: all prompts packed into one (total, ...) batch; keys and values go to their pages.
    tokens = torch.cat(prompts)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    seq = torch.repeat_interleave(torch.arange(B, device=dev), torch.tensor(lens, device=dev))
    pos = torch.arange(tokens.shape[0], device=dev) - cu[:-1].long()[seq]
    slot = (block_table[seq, pos // page].long(), pos % page)

    def prefill_attention(i, q, k, v):
        k_cache[i][slot], v_cache[i][slot] = k, v
        return tileattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    with torch.inference_mode():
        model.forward(tokens, pos, prefill_attention)  # warm-up: compiles the kernels (cached on disk)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model.forward(tokens, pos, prefill_attention)
        next_tok = logits[cu[1:].long() - 1].argmax(-1)  # (B,) each prompt's next token
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0

        # Decode: one token per sequence per step; the kernel appends its k, v at cache_seqlens.
        cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
        generated, step_logits = [next_tok], []

        def decode_attention(i, q, k, v):
            return tileattn.flash_attn_with_kvcache(q, k_cache[i], v_cache[i], k, v, cache_seqlens, block_table,
                                                    causal=True)  # fmt: skip

        for step in tqdm(range(args.new_tokens - 1), desc="decode", unit="step"):
            if step == 1:  # time from the second step: the first compiles the decode kernels
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            logits = model.forward(generated[-1][:, None], cache_seqlens.long()[:, None], decode_attention)[:, 0]
            step_logits.append(logits)
            generated.append(logits.argmax(-1))
            cache_seqlens += 1
        torch.cuda.synchronize()
        decode_s = time.perf_counter() - t0

        # The same model, dense SDPA over each whole sequence (prompt + generated tokens).
        out = torch.stack(generated, 1)  # (B, new_tokens)
        worst = 0.0
        agree = 0
        for b in range(B):
            full = torch.cat([prompts[b], out[b]])
            sdpa = lambda i, q, k, v: F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
            ).transpose(0, 1)
            ref = model.forward(full, torch.arange(full.shape[0], device=dev), sdpa)
            ref = ref[lens[b] : lens[b] + args.new_tokens - 1].float()  # the logits of decode steps
            ours = torch.stack([s[b] for s in step_logits]).float()
            worst = max(worst, ((ours - ref).abs().max() / ref.abs().max()).item())
            agree += (ours.argmax(-1) == ref.argmax(-1)).sum().item()
    steps = args.new_tokens - 1
    print(f"prompts: {B} of {min(lens)}..{max(lens)} tokens, prefill {sum(lens) / prefill_s:,.0f} tokens/s")
    print(f"decode: {B * (steps - 1) / decode_s:,.0f} tokens/s ({steps} steps of {B}, page size {page})")
    print(f"logits vs dense SDPA: max |diff| / max |logit| = {worst:.3g}; greedy tokens agree {agree}/{B * steps}")
    if worst > 0.05:
        raise SystemExit("logits differ from the dense SDPA run beyond bf16 tolerance")


if __name__ == "__main__":
    main()

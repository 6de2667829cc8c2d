"""Ring attention on P GPUs against one (docs/distributed.md): forward and forward + backward at
N = 131072, H = 32 over 8 K/V heads, D = 128, bf16, causal, B = 1; the same ring with its
point-to-point transfers left out (how much of the communication the attention hides); PyTorch's
context_parallel (SDPA cuDNN / flash, K/V heads repeated: it takes no GQA) in the same run.

    python scripts/ring_bench.py [--gpus 2] [--seqlen 131072] [--out bench/results/ring.json]

It spawns one process per GPU (NCCL).  Timing: every rank runs the same fixed number of calls
(warm-up, then CUDA events around ITERS calls, median of REPEATS), because a call holds
collectives and an adaptive loop such as triton.testing.do_bench could run a different number of
calls on each rank and hang; rank 0's times are reported.  FLOPs = 4 B H N^2 D / 2 (causal), x 2.5
more for the backward.
"""

import argparse
import datetime
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WARMUP, ITERS, REPEATS = 2, 2, 3


def _time(fn) -> float:
    """Median ms per call over REPEATS windows of ITERS calls, every rank in step."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / ITERS)
    return statistics.median(times)


def _context_parallel_ms(q, k, v, P) -> float:
    """PyTorch's context_parallel around SDPA, from full (B, H, N, D) buffers that it shards in
    place on entering its context (timed inside it: the sharding is not counted)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    mesh = init_device_mesh("cuda", (P,))
    g = q.shape[1] // k.shape[1]
    q, k, v = (t.clone() for t in (q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)))
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        return _time(lambda: sdpa(q, k, v, is_causal=True))


def _worker(rank, P, init_file, args, out_file):
    import tileattn
    from tileattn import bench, distributed

    torch.cuda.set_device(rank)
    # A rank that fails leaves the other in a collective: two minutes, not NCCL's default ten.
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=P, timeout=timeout)
    B, N, H, H_kv, D = 1, args.seqlen, 32, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(B, N, H_kv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    shard = lambda t: distributed.zigzag_shard(t, rank, P).requires_grad_()
    ql, kl, vl, dl = shard(q), shard(k), shard(v), distributed.zigzag_shard(dout, rank, P)
    full = [t.clone().requires_grad_() for t in (q, k, v)]

    def fwd_bwd(f, inputs, grad):
        def run():
            out = f(*inputs)
            torch.autograd.backward(out, grad)
            for t in inputs:
                t.grad = None

        return run

    class NoTransfer(distributed._Ring):
        """Exchanges that hand back the tensors sent (equal shards): the same blocks, no traffic."""

        def exchange(self, tensors, lengths, tag):
            return lambda: list(tensors)

    ring = lambda *t: distributed.ring_flash_attn_func(*t, causal=True)
    no_transfer, scale = NoTransfer(None, N), D**-0.5
    rows = {}
    # One GPU: rank 0 alone runs the whole sequence (the other ranks run it too, in step).
    rows["1 GPU, forward"] = _time(lambda: tileattn.flash_attn_func(*full, causal=True))
    rows["1 GPU, forward + backward"] = _time(fwd_bwd(lambda *t: tileattn.flash_attn_func(*t, causal=True), full, dout))
    rows[f"{P} GPUs ring, forward"] = _time(lambda: ring(ql, kl, vl))
    rows[f"{P} GPUs ring, forward + backward"] = _time(fwd_bwd(ring, [ql, kl, vl], dl))
    with torch.no_grad():
        rows[f"{P} GPUs ring without transfers, forward"] = _time(
            lambda: distributed._ring_forward(ql, kl, vl, no_transfer, scale, True, distributed.KERNELS)
        )

    def write():  # rank 0's rows so far (kept if the peer below hangs the call)
        if rank != 0:
            return
        flops = 4 * B * H * N * N * D / 2
        result = dict(bench.environment(), suite="ring", gpus=P, B=B, N=N, H=H, H_kv=H_kv, D=D,
                      dtype="bfloat16", causal=True, command="python scripts/ring_bench.py " + " ".join(
                          f"--{k} {v}" for k, v in vars(args).items() if k != "out"), rows=[])  # fmt: skip
        for name, ms in rows.items():
            row = dict(impl=name, ms=ms if isinstance(ms, float) else None, note=None if isinstance(ms, float) else ms)
            if isinstance(ms, float):
                row["tflops"] = flops * (3.5 if "backward" in name else 1.0) / ms / 1e9
            result["rows"].append(row)
        Path(out_file).write_text(json.dumps(result, indent=1))

    write()
    try:
        heads = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
        rows[f"{P} GPUs context_parallel SDPA, forward"] = _context_parallel_ms(*heads, P)
    except Exception as e:  # an experimental API: its failure is a result, not a crash
        rows[f"{P} GPUs context_parallel SDPA, forward"] = f"failed: {type(e).__name__}: {e}"[:300]
    write()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=131072)
    parser.add_argument("--out", default="bench/results/ring.json")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (the device's KINDS.md)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "ring.json")
        try:
            mp.spawn(_worker, args=(args.gpus, os.path.join(tmp, "init"), args, out_file), nprocs=args.gpus)
        except Exception as e:  # the rows measured before a rank failed still count
            print(f"a rank failed: {e}"[:2000])
        if not os.path.exists(out_file):
            raise SystemExit("no rows measured")
        result = json.loads(Path(out_file).read_text())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    one = {r["impl"].split(", ")[1]: r["ms"] for r in result["rows"] if r["impl"].startswith("1 GPU")}
    print("| impl | ms | TFLOP/s | speed-up over 1 GPU |\n|---|---|---|---|")
    for r in result["rows"]:
        if r["ms"] is None:
            print(f"| {r['impl']} | {r['note']} | | |")
            continue
        base = one.get(r["impl"].split(", ")[-1])
        print(f"| {r['impl']} | {r['ms']:.2f} | {r['tflops']:.0f} | {base / r['ms']:.2f}x |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

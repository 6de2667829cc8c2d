"""Context parallelism: ring attention over torch.distributed.

A sequence too long for one GPU is split over the P ranks of a process group.  Each rank holds
its shard of q, k and v in flash-attn's layout (B, N_local, H, D), cut by the zigzag layout: the
sequence is split into 2P chunks (torch.tensor_split's sizes, so any length works) and rank r
holds chunks r and 2P - 1 - r, in that order.  Under a causal mask every rank then has the same
work: an early chunk sees few keys, its partner many.

``ring_flash_attn_func`` runs P steps.  At step s rank r holds the K/V shard of rank
src = (r - s) mod P; it starts sending that shard on to rank r + 1 and receiving the next one from
r - 1 (one ``batch_isend_irecv``: NCCL runs it on its own stream), attends to the shard it holds
meanwhile, and merges the block's output into its running output through their log-sum-exps in
float32, or float64 for float64 inputs (as split-KV decode merges its chunks).  With the causal
mask and the zigzag layout each step is one unmasked or diagonal block (``block_of_step``):

- src = r: both local chunks against both, under the causal mask (the local order is the global
  order, so the mask is the plain one);
- src < r: both local chunks against src's first chunk (earlier than both), unmasked;
- src > r: the second local chunk against both of src's chunks (both earlier), unmasked.

The backward runs the same ring with the forward's final O and lse: dQ stays home, and each K/V
shard's dK/dV accumulate in the merge's dtype as they travel with it, one more hop bringing them
home after the last step.  GQA passes K/V with their own heads (no copies); the block kernels sum
dK/dV over each group.  The block attention is pluggable (``BlockAttention``): ``KERNELS`` runs
tileattn's forward and backward rungs on CUDA tensors, ``REFERENCE`` runs reference.py's float64
NumPy definitions (the CPU tests check the protocol with it on the gloo backend).

torch.compile: the ring is one custom op (``tileattn::ring_attention``, its backward another), so
a compiled model keeps it in its graph, fullgraph=True included, and runs it as it is: the
point-to-point transfers, their overlap and the shape all-gather happen inside the op, which the
compiler does not trace.  The process group travels to the op by name.  Not yet: windows,
softcap, ALiBi.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist


def zigzag_chunk_sizes(seqlen: int, world_size: int) -> list[int]:
    """The 2P chunk lengths of a sequence of ``seqlen`` tokens (torch.tensor_split's)."""
    n = 2 * world_size
    return [seqlen // n + (i < seqlen % n) for i in range(n)]


def zigzag_shard_sizes(seqlen: int, world_size: int) -> list[tuple[int, int]]:
    """Every rank's (first chunk, shard) lengths: chunks r and 2P - 1 - r of zigzag_chunk_sizes."""
    chunks = zigzag_chunk_sizes(seqlen, world_size)
    return [(chunks[r], chunks[r] + chunks[2 * world_size - 1 - r]) for r in range(world_size)]


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s shard of the full sequence ``x`` (sequence along ``dim``): chunks rank
    and 2P - 1 - rank of 2P, concatenated (a new contiguous tensor)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    chunks = torch.tensor_split(x, 2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim).contiguous()


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's shard (in rank order): zigzag_shard undone."""
    P = len(shards)
    sizes = zigzag_shard_sizes(sum(s.shape[dim] for s in shards), P)
    parts = [None] * (2 * P)
    for r, (s, (first, n)) in enumerate(zip(shards, sizes)):
        parts[r], parts[2 * P - 1 - r] = torch.split(s, [first, n - first], dim=dim)
    return torch.cat(parts, dim=dim)


def zigzag_gather(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """The full sequence on every rank, from each rank's shard ``x`` (an all-gather, not
    differentiable).  The shards may differ in length by the chunking's one token: each is padded
    to the longest for the all-gather (gloo takes equal sizes only) and trimmed after."""
    P = dist.get_world_size(group)
    lengths = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(P)]
    dist.all_gather(lengths, torch.tensor([x.shape[dim]], device=x.device), group=group)
    lengths = [int(t) for t in lengths]
    padded = torch.nn.functional.pad(x.movedim(dim, -1), (0, max(lengths) - x.shape[dim])).movedim(-1, dim)
    shards = [torch.empty_like(padded) for _ in range(P)]
    dist.all_gather(shards, padded.contiguous(), group=group)
    return zigzag_unshard([s.narrow(dim, 0, n) for s, n in zip(shards, lengths)], dim=dim)


def block_of_step(rank: int, src: int, first_q: int, first_k: int, causal: bool):
    """The rows of the local q and of src's K/V shard that meet at that step, and whether under the
    causal mask: (q rows, K/V rows, causal).  first_q, first_k: the lengths of the first zigzag
    chunk of the local shard and of src's."""
    if not causal:
        return slice(None), slice(None), False
    if src == rank:
        return slice(None), slice(None), True
    if src < rank:
        return slice(None), slice(0, first_k), False
    return slice(first_q, None), slice(None), False


@dataclasses.dataclass(frozen=True)
class BlockAttention:
    """One block of the ring: forward(q, k, v, scale, causal) -> (O in q's dtype, lse (B, H, Nq)
    float32); backward(dO, q, k, v, O, lse, scale, causal) -> (dq, dk, dv) with the final O and
    lse of the rows.  Layout (B, N, H, D); causal is the top-left diagonal (equal lengths)."""

    forward: Callable
    backward: Callable


def _kernel_forward(q, k, v, scale, causal):
    from .api import flash_attn_func

    return flash_attn_func(q, k, v, softmax_scale=scale, causal="top_left" if causal else False, return_lse=True)


def _kernel_backward(dout, q, k, v, out, lse, scale, causal):
    from .backward import attention_backward

    mode = "top_left" if causal else None
    return attention_backward(q, k, v, out, lse.contiguous(), dout, scale, mode, "bnhd", float32_grads=True)


def _to_numpy(t):  # (B, N, H, D) torch -> (B, H, N, D) float64 NumPy: reference.py's layout
    return t.detach().cpu().double().numpy().transpose(0, 2, 1, 3)


def _from_numpy(x, like):  # reference.py's (B, H, N, D) -> (B, N, H, D) like ``like``
    return torch.from_numpy(x.transpose(0, 2, 1, 3).copy()).to(like.device, like.dtype)


def _reference_forward(q, k, v, scale, causal):
    from .reference import attention_naive

    O, lse = attention_naive(*map(_to_numpy, (q, k, v)), scale, "top_left" if causal else None)
    return _from_numpy(O, q), torch.from_numpy(lse).to(q.device, _accumulator(q.dtype))


def _reference_backward(dout, q, k, v, out, lse, scale, causal):
    from .reference import attention_backward_tiled

    # One block of the FA2 loop nest in float64: P rebuilt from the given (final) lse and O.
    n = max(q.shape[1], k.shape[1], 1)
    dq, dk, dv = attention_backward_tiled(
        *map(_to_numpy, (q, k, v, out)), lse.detach().cpu().double().numpy(), _to_numpy(dout), scale,
        "top_left" if causal else None, Br=n, Bc=n, dtype=np.float64,
    )  # fmt: skip
    return _from_numpy(dq, q), _from_numpy(dk, k), _from_numpy(dv, v)


KERNELS = BlockAttention(_kernel_forward, _kernel_backward)
REFERENCE = BlockAttention(_reference_forward, _reference_backward)


class _Ring:
    """This rank's place on the group's ring: sends go to rank + 1, receives come from rank - 1;
    shard_sizes: every rank's (first chunk, local length), from the full length."""

    def __init__(self, group, seqlen: int):
        self.group = group if group is not None else dist.group.WORLD
        self.size, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)
        self.shard_sizes = zigzag_shard_sizes(seqlen, self.size)

    def exchange(self, tensors, lengths, tag: int) -> Callable[[], list]:
        """Send ``tensors`` on, receive the previous rank's (sequence dim 1 of ``lengths`` rows):
        started now, the returned call waits and gives the received tensors."""
        recv = [t.new_empty((t.shape[0], n, *t.shape[2:])) for t, n in zip(tensors, lengths)]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag) for t in recv]
        works = dist.batch_isend_irecv(ops)

        def wait():
            for w in works:
                w.wait()
            return recv

        return wait


def _accumulator(dtype):
    """The dtype partial results merge in: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _merge(out, lse, o, l):
    """out (B, N, H, D) and lse (B, H, N), in the accumulator dtype, absorb a partial result (o, l) of the same rows:
    each softmax reweighted by exp(its lse - the joint lse).  A row no key has reached yet (lse
    -inf on both sides) keeps weight 0, not NaN."""
    new = torch.logaddexp(lse, l)
    base = torch.where(torch.isinf(new), 0.0, new)
    weight = lambda x: torch.exp(x - base).transpose(1, 2).unsqueeze(-1)
    out.mul_(weight(lse)).add_(o.to(out.dtype) * weight(l))
    lse.copy_(new)


def _ring_steps(ring: _Ring, k, v, causal):
    """The ring's P steps, shared by the forward and the backward: each yields the K/V shard held
    (k, v), the rows of the local q and of that shard that meet (block_of_step) and the length of
    the shard arriving next.  The next shard travels while the caller works on the step (it is
    sent before the yield, received after)."""
    first_q = ring.shard_sizes[ring.rank][0]
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        n_next = ring.shard_sizes[(src - 1) % ring.size][1]
        last = step + 1 == ring.size
        if not last:
            receive = ring.exchange([k, v], (n_next, n_next), tag=0)
        rows, keys, masked = block_of_step(ring.rank, src, first_q, ring.shard_sizes[src][0], causal)
        yield k, v, rows, keys, masked, n_next
        if not last:
            k, v = receive()


def _ring_forward(q, k, v, ring: _Ring, scale, causal, blocks: BlockAttention):
    B, N, H, D = q.shape
    acc = _accumulator(q.dtype)
    out = torch.zeros((B, N, H, D), dtype=acc, device=q.device)
    lse = torch.full((B, H, N), -math.inf, dtype=acc, device=q.device)
    for k_s, v_s, rows, keys, masked, _ in _ring_steps(ring, k, v, causal):
        o, l = blocks.forward(q[:, rows], k_s[:, keys], v_s[:, keys], scale, masked)
        _merge(out[:, rows], lse[:, :, rows], o, l)
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, scale, causal, blocks: BlockAttention):
    zeros = lambda t: torch.zeros(t.shape, dtype=_accumulator(t.dtype), device=t.device)
    dq, dkv, receive_grads = zeros(q), [zeros(k), zeros(v)], None
    for k_s, v_s, rows, keys, masked, n_next in _ring_steps(ring, k, v, causal):
        dq_b, dk_b, dv_b = blocks.backward(
            dout[:, rows], q[:, rows], k_s[:, keys], v_s[:, keys], out[:, rows], lse[:, :, rows], scale, masked
        )
        dq[:, rows] += dq_b
        if receive_grads is not None:
            dkv = receive_grads()  # this shard's dK / dV so far, from the rank that held it last
        dkv[0][:, keys] += dk_b
        dkv[1][:, keys] += dv_b
        # On to the rank that holds this shard next; after the last step, that is its owner (one
        # rank alone is its own owner throughout: nothing to send).
        if ring.size > 1:
            receive_grads = ring.exchange(dkv, (n_next, n_next), tag=1)
    dk, dv = receive_grads() if ring.size > 1 else dkv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


_BLOCKS = {"kernels": KERNELS, "reference": REFERENCE}


def _ring_of(q, k, group_name: str) -> _Ring:
    """The ring of the named group, after every rank agreed on the shards (_agree)."""
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return _Ring(group, _agree(q, k, None, group))


# The ring as custom ops: opaque to torch.compile (the transfers run as written), and with fake
# implementations (shapes only) so that a compiled graph can hold them.  lse is returned for
# inspection, not differentiated (its gradient is not computed; ring_flash_attn_func detaches it).
@torch.library.custom_op("tileattn::ring_attention", mutates_args=())
def _ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group_name: str, scale: float, causal: bool, blocks: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ring_forward(q, k, v, _ring_of(q, k, group_name), scale, causal, _BLOCKS[blocks])


@_ring_attention.register_fake
def _(q, k, v, group_name, scale, causal, blocks):
    B, N, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, N), dtype=_accumulator(q.dtype))


@torch.library.custom_op("tileattn::ring_attention_backward", mutates_args=())
def _ring_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    group_name: str,
    scale: float,
    causal: bool,
    blocks: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ring = _ring_of(q, k, group_name)
    return _ring_backward(dout.contiguous(), q, k, v, out, lse, ring, scale, causal, _BLOCKS[blocks])


@_ring_attention_backward.register_fake
def _(dout, q, k, v, out, lse, group_name, scale, causal, blocks):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *ctx.args = inputs
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return *_ring_attention_backward(dout, q, k, v, out, lse, *ctx.args), None, None, None, None


_ring_attention.register_autograd(_backward, setup_context=_setup_context)


_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


def _local_problem(q, k, v, causal, blocks) -> Exception | None:
    """What is wrong with this rank's arguments on their own, or None.  An input that requires
    grad needs a backward rung at its dtype and head dim: a gradient is never dropped silently."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            return ValueError(f"{name} must be a 4-D tensor (B, N_local, H, D), got {getattr(t, 'shape', type(t))}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
        return ValueError(
            f"k and v must be (B, N_local, H_kv, D) with q's B, N_local and D: q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[2] % k.shape[2]:
        return ValueError(f"q's heads ({q.shape[2]}) must be a multiple of k's ({k.shape[2]})")
    if not (k.dtype == v.dtype == q.dtype and k.device == v.device == q.device) or q.dtype not in _DTYPE_CODES:
        return ValueError(f"q, k, v must share a floating dtype and a device, got {q.dtype}/{k.dtype}/{v.dtype}")
    if causal not in (False, True, "top_left", "bottom_right"):
        return ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    if not any(blocks is b for b in _BLOCKS.values()):
        return ValueError(f"blocks must be distributed.KERNELS or distributed.REFERENCE, got {blocks!r}")
    if blocks is KERNELS and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        from .api import _check_backward_exists

        try:
            _check_backward_exists(q, k, v)
        except RuntimeError as e:
            return e
    return None


def _agree(q, k, problem, group) -> int:
    """Every rank's shard described to every other (one all-gather, a host sync), so that all of
    them raise together, before any point-to-point transfer, when one rank's arguments are wrong
    or the ranks' shapes disagree; returns the full sequence length."""
    fields = ("ok", "N_local", "B", "H", "H_kv", "D", "dtype")
    mine = [0] * len(fields)
    if not problem:
        mine = [1, q.shape[1], q.shape[0], q.shape[2], k.shape[2], q.shape[3], _DTYPE_CODES[q.dtype]]
    nccl = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    rows = [torch.zeros(len(fields), dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, torch.tensor(mine, dtype=torch.int64, device=device), group=group)
    rows = [r.tolist() for r in rows]
    if problem:
        raise problem
    bad = [r for r, row in enumerate(rows) if not row[0]]
    if bad:
        raise ValueError(f"ranks {bad} of the ring were passed arguments they refused (their errors say which)")
    if any(row[2:] != rows[0][2:] for row in rows):
        raise ValueError(f"the ranks' shards disagree on (B, H, H_kv, D, dtype): {[tuple(r[2:]) for r in rows]}")
    seqlen, P, rank = sum(r[1] for r in rows), len(rows), dist.get_rank(group)
    expected = [n for _, n in zigzag_shard_sizes(seqlen, P)]
    if [r[1] for r in rows] != expected:
        raise ValueError(
            f"the ranks' shards hold {[r[1] for r in rows]} tokens; the zigzag layout of {seqlen} tokens "
            f"over {P} ranks gives {expected} (see zigzag_shard); this is rank {rank}"
        )
    return seqlen


def ring_flash_attn_func(
    q, k, v, group=None, softmax_scale=None, causal=False, *, return_lse=False, blocks: BlockAttention = KERNELS
):
    """Attention over a sequence sharded across ``group`` (default: the world) in the zigzag layout
    (``zigzag_shard``), differentiable.

    Args:
        q: (B, N_local, H, D), this rank's shard; k, v: (B, N_local, H_kv, D), H a multiple of H_kv
            (GQA/MQA), the same shard's keys and values.  Every rank's N_local follows from the
            full length; one all-gather of the ranks' shapes (a host sync) finds it and checks
            that the ranks agree, so that a bad argument raises on every rank, not a hang.
        softmax_scale: default 1/sqrt(D).
        causal: False, or True / "top_left" / "bottom_right" (the same mask: q and k span the same
            positions).
        return_lse: also return lse (B, H, N_local), natural log, in the merge's dtype (float32;
            float64 for float64 inputs).
        blocks: the block attention (``KERNELS``: tileattn's rungs, CUDA; ``REFERENCE``: reference.py's
            float64 NumPy attention, results back on the inputs' device).

    Returns O (B, N_local, H, D) in q's dtype (merged in float32, or float64 for float64 inputs),
    and lse if asked.
    """
    problem = _local_problem(q, k, v, causal, blocks)
    if not dist.is_initialized():
        raise problem or RuntimeError("ring_flash_attn_func needs an initialized torch.distributed process group")
    group = group if group is not None else dist.group.WORLD
    if problem:  # the other ranks meet this one in the op's all-gather, and raise there too
        _agree(q, k, problem, group)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))  # sent whole
    name = next(n for n, b in _BLOCKS.items() if b is blocks)
    out, lse = _ring_attention(q, k, v, group.group_name, scale, causal is not False, name)
    return (out, lse.detach()) if return_lse else out

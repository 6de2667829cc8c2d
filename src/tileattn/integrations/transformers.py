"""Hugging Face transformers: ``attn_implementation="tileattn"``.

    import tileattn.integrations.transformers as tileattn_hf
    tileattn_hf.register()              # once, before loading or switching a model
    model = AutoModelForCausalLM.from_config(config, attn_implementation="tileattn")

``register()`` adds tileattn's forward to transformers' ``AttentionInterface`` and a mask builder
to ``AttentionMaskInterface`` under the same name (``padding_aware_mask``).  Where tileattn's
variable-length kernels run (CUDA, fp16/bf16, their head dims), the mask is what transformers'
flash-attention path gets: None for a batch without padding, else the (B, L) padding mask of
the first L key slots (L < the keys' length for a static cache), the queries being the last
ones of those L positions; a sliding-window layer with fewer queries than keys (decoding) gets an
all-ones mask, so that its window is applied per sequence.  Elsewhere it is SDPA's 4-D mask,
except that a sliding-window layer's causal mask without padding over a whole sequence is not
built either (``window_aware_mask``): the attention function applies the window itself from the
``sliding_window`` argument the model passes.  So a batch without padding reaches the attention
function with no mask at all (causality comes from ``module.is_causal``, aligned top-left as
transformers' SDPA path aligns it).

What runs where:
  * No mask, no dropout, a head dim and dtype tileattn takes (for training: one its backward
    takes too, tileattn.api.backward_head_dims): tileattn, GQA without repeating k/v.  The
    logit softcap (Gemma 2) and a sliding window (Mistral, Gemma 2/3) run in tileattn's variants
    kernels, and train through their backward (bwd_v5_variants on Hopper at head dims 64 and 128,
    else bwd_v2_variants: fp16/bf16, not deterministic).
  * A padding mask (batched generation's prefill and decode steps, static caches): the valid
    tokens are gathered (one host sync for their count, as transformers' flash-attention path)
    and run through ``flash_attn_varlen_func``, causal bottom-right per sequence, windows and
    softcap included; padded query rows get zeros.  Training too: flash_attn_varlen_func's
    backward (one launch over the sequences, bwd_v2_varlen) and the gather's.
  * Anything else falls back to transformers' own SDPA path, with one warning per reason:
    dropout, position bias, softcap or a sliding window on inputs that require grad where the
    variants' backward does not run (FP32, its head dims, deterministic algorithms), inputs that
    require grad at a head dim without a backward rung (the fallback keeps training correct), an
    unsupported head dim or dtype, a mask of another kind (chunked attention).  A padding mask is
    turned into SDPA's 4-D mask for it.  (transformers' SDPA path itself drops the softcap: run such models with "eager"
    for a reference.)
transformers is an optional dependency: ``pip install 'tileattn[transformers]'``.
"""

from __future__ import annotations

import warnings

import torch

from .. import api

NAME = "tileattn"
_warned: set[str] = set()


def register(name: str = NAME) -> None:
    """Register tileattn with transformers under ``name`` (default "tileattn")."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_aware_mask)


def _variants_run(config, dtype, device, variants: bool = True) -> bool:
    """Whether tileattn's packed kernels (variants: its window / softcap kernels) take this model's
    head dim and dtype here."""
    from .. import serving

    device = torch.device(device) if device is not None else None
    if config is None or device is None or device.type != "cuda" or dtype not in api._DTYPES:
        return False
    D = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        serving._packed_path("", dtype, D, device, variants)
    except NotImplementedError:
        return False
    return True


def padding_aware_mask(*args, **kwargs):
    """The mask builder registered for tileattn: transformers' flash-attention mask (None without
    padding, else the (B, L) padding mask) where the variable-length kernels run, with an
    all-ones mask for a sliding-window layer that decodes (fewer queries than keys: its window
    is then applied per sequence); window_aware_mask (SDPA's 4-D mask) elsewhere, and always for
    chunked attention, which a padding mask cannot express."""
    from transformers.masking_utils import flash_attention_mask

    config = kwargs.get("config")
    window = kwargs.get("local_size")
    window_layer = window is not None and window == getattr(config, "sliding_window", None)
    variants = window_layer or bool(getattr(config, "attn_logit_softcapping", None))
    if getattr(config, "attention_chunk_size", None) or not _variants_run(
        config, kwargs.get("dtype"), kwargs.get("device"), variants
    ):
        return window_aware_mask(*args, **kwargs)
    mask = flash_attention_mask(*args, **kwargs)
    q_length, kv_length = kwargs["q_length"], kwargs["kv_length"]
    if mask is None and window_layer and q_length != kv_length:
        mask = torch.ones(kwargs["batch_size"], kv_length, dtype=torch.bool, device=kwargs.get("device"))
    return mask


def window_aware_mask(*args, **kwargs):
    """transformers' SDPA mask, but None (no mask) for a sliding-window causal layer whose mask
    would be nothing but causality and the window (no padding, no extra mask functions, as many
    queries as keys) where tileattn's window kernel runs: attention_forward then applies the
    window from its sliding_window argument."""
    from transformers.masking_utils import _ignore_causal_mask_sdpa, prepare_padding_mask, sdpa_mask

    q_length, kv_length, config = kwargs.get("q_length"), kwargs.get("kv_length"), kwargs.get("config")
    if (
        kwargs.get("local_size") is not None
        # a sliding window, not the chunked attention (Llama 4) that also passes local_size
        and kwargs.get("local_size") == getattr(config, "sliding_window", None)
        and not getattr(config, "attention_chunk_size", None)
        and kwargs.get("allow_is_causal_skip", True)
        and q_length == kv_length
        and _variants_run(config, kwargs.get("dtype"), kwargs.get("device"))
    ):
        kv_offset = kwargs.get("kv_offset", 0)
        padding = prepare_padding_mask(kwargs.get("attention_mask"), kv_length, kv_offset)
        if _ignore_causal_mask_sdpa(padding, q_length, kv_length, kwargs.get("q_offset", 0), kv_offset, None):
            return None
    return sdpa_mask(*args, **kwargs)


def _fallback(
    reason: str, module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' SDPA attention, after one warning per reason.  Two things it would get wrong
    are mended first: a sliding window whose mask window_aware_mask left out (it is built here),
    and a softcap, which transformers' SDPA path drops (the call runs _math_attention instead)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if reason not in _warned:
        _warned.add(reason)
        what = "a softcapped attention in plain PyTorch" if softcap else "transformers' SDPA attention"
        warnings.warn(f"tileattn: {reason}; this call (and the ones like it) runs {what}", stacklevel=3)
    if attention_mask is None and window and key.shape[2] > window:
        # Only window_aware_mask leaves a binding window's mask out, and only with as many queries
        # as keys: query i sees keys i - window + 1 .. i.
        i = torch.arange(query.shape[2], device=query.device)[:, None]
        j = torch.arange(key.shape[2], device=query.device)[None, :]
        attention_mask = ((j <= i) & (j > i - window))[None, None]
    if softcap:
        return _math_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap)
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def _math_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap):
    """Attention with a logit softcap in plain PyTorch (differentiable), as transformers' eager
    path computes it: scores scaled, softcap * tanh(scores / softcap), mask (boolean: True keeps;
    float: added), softmax in float32.  query (B, H, Nq, D), key/value (B, H_kv, Nk, D) -> (B, Nq,
    H, D)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = softcap * torch.tanh(scores / softcap)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and causal and query.shape[2] > 1:  # top-left, as transformers' SDPA path
        attention_mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    elif attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[2]]
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return (probs @ value).transpose(1, 2).contiguous(), None


def _unsupported(query, key, value, attention_mask, dropout, kwargs) -> str | None:
    if attention_mask is not None and attention_mask.dim() != 2:
        return "an attention mask other than padding (chunked attention, say) is not supported"
    if dropout:
        return "dropout is not supported"
    if kwargs.get("position_bias") is not None:
        return "position bias is not supported"
    if query.dtype not in api._DTYPES or query.device.type != "cuda":
        return f"dtype {query.dtype} on {query.device} is not supported"
    dtype, D = api._DTYPES[query.dtype], query.shape[-1]
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if needs_grad and (kwargs.get("softcap") or kwargs.get("sliding_window")):
        try:  # flash_attn_func's own rule for the variants' gradients (bwd_v2_variants)
            api._check_variants_backward(query, key, value, torch.are_deterministic_algorithms_enabled())
        except RuntimeError as e:
            return str(e)
    if needs_grad and D not in api.backward_head_dims(dtype):
        return f"inputs require grad and tileattn has no backward pass for {dtype} at head dim {D}"
    if D not in api.head_dims(dtype) or key.shape[-1] != D:
        return f"head dim {D} is not supported for {query.dtype}"
    return None


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Nq, D), key/value (B, H_kv, Nk, D);
    returns (attn_output (B, Nq, H, D), None)."""
    reason = _unsupported(query, key, value, attention_mask, dropout, kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None and attention_mask.dim() == 2:  # padding_aware_mask's padding mask
        if reason is None and query.dtype not in (torch.float16, torch.bfloat16):
            reason = f"padded batches run in float16 or bfloat16, not {query.dtype}"
        if reason is None:
            try:
                return _padded_attention(query, key, value, attention_mask, scaling, is_causal, kwargs), None
            except NotImplementedError as e:
                reason = str(e)
        attention_mask = _dense_mask(attention_mask, query.shape[2], key.shape[2], is_causal, kwargs)
    if reason is not None:
        return _fallback(
            reason,
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # As transformers' SDPA path: a single query token attends to every key; otherwise causal is
    # aligned top-left (a static cache's unused slots sit after the keys in use).
    causal = "top_left" if (is_causal and query.shape[2] > 1) else False
    # transformers' sliding window W keeps keys j > i - W (masking_utils.sliding_window_overlay):
    # W - 1 keys to the left.  Without a mask it reaches here only when it binds in full (as many
    # queries as keys, attention_mask above) or not at all (fewer keys than W).
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap") or 0.0
    window_size = (window - 1, 0) if window and causal else (-1, -1)
    try:
        out = api.flash_attn_func(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scaling,
            causal=causal, window_size=window_size, softcap=softcap,
        )  # fmt: skip
    except NotImplementedError as e:  # a softcap at a head dim / arch the variants lack
        if window and key.shape[2] >= window:  # (window_aware_mask built the mask where they lack it)
            raise
        return _fallback(
            f"{e} (transformers' SDPA drops the softcap)", module, query, key, value, None,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    return out, None  # (B, Nq, H, D), contiguous: what the model's o_proj reshapes


def _padded_attention(query, key, value, padding, scaling, is_causal, kwargs):
    """A padded batch through flash_attn_varlen_func, as transformers' flash-attention path runs
    it: padding (B, L) marks the valid tokens among the first L key slots, and the queries are
    the last Nq of those L positions.  The valid keys and queries are gathered into packed
    tensors (the count of valid tokens is a host sync), attention runs per sequence (causal
    bottom-right: each sequence's last query sits at its last key), and the outputs return to
    their rows, zeros on padded query rows.  query (B, H, Nq, D), key/value (B, H_kv, Nk, D) ->
    (B, Nq, H, D)."""
    from .. import serving

    B, H, Nq, D = query.shape
    L = padding.shape[1]
    padding = padding.bool()
    valid_q = padding[:, L - Nq :]
    cu = lambda m: torch.nn.functional.pad(m.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    rows_k, rows_q = padding.flatten().nonzero().squeeze(1), valid_q.flatten().nonzero().squeeze(1)
    packed = lambda t, n, rows: t[:, :, :n].transpose(1, 2).reshape(B * n, t.shape[1], D)[rows]
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap") or 0.0
    out = serving.flash_attn_varlen_func(
        packed(query, Nq, rows_q), packed(key, L, rows_k), packed(value, L, rows_k), cu(valid_q), cu(padding),
        Nq, L, softmax_scale=scaling, causal="bottom_right" if is_causal else False,
        window_size=(window - 1, 0) if window and is_causal else (-1, -1), softcap=softcap,
    )  # fmt: skip
    return out.new_zeros(B * Nq, H, D).index_copy_(0, rows_q, out).view(B, Nq, H, D)


def _dense_mask(padding, Nq: int, Nk: int, is_causal: bool, kwargs) -> torch.Tensor:
    """padding_aware_mask's (B, L) padding mask as SDPA's (B, 1, Nq, Nk) boolean mask, for the
    fallback: key j < L valid and, causal, at most query i's position L - Nq + i (and inside a
    sliding window W: above that position minus W).  Padded query rows see every key (their
    output is discarded; a row that sees none would be NaN)."""
    B, L = padding.shape
    padding = padding.bool()
    pos = torch.arange(Nq, device=padding.device)[:, None] + (L - Nq)
    j = torch.arange(Nk, device=padding.device)[None, :]
    keep = torch.zeros(B, Nk, dtype=torch.bool, device=padding.device)
    keep[:, :L] = padding
    keep = keep[:, None, :] & torch.ones(Nq, Nk, dtype=torch.bool, device=padding.device)
    if is_causal:
        keep &= j <= pos
        if kwargs.get("sliding_window"):
            keep &= j > pos - kwargs["sliding_window"]
    keep |= ~padding[:, L - Nq :, None]
    return keep[:, None]


def random_llama(
    hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int, dtype=torch.bfloat16, seed: int = 0
):
    """A randomly initialised Llama-style causal LM on the GPU (no downloaded weights): what the
    tests and the end-to-end benchmark run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=32768,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(device="cuda", dtype=dtype).eval()

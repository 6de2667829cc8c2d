"""Hugging Face transformers: ``attn_implementation="tileattn"``.

    import tileattn.integrations.transformers as tileattn_hf
    tileattn_hf.register()              # once, before loading or switching a model
    model = AutoModelForCausalLM.from_config(config, attn_implementation="tileattn")

``register()`` adds tileattn's forward to transformers' ``AttentionInterface`` and SDPA's mask
builder under the same name to ``AttentionMaskInterface``, so that a batch without padding
reaches the attention function with no mask at all (causality comes from ``module.is_causal``,
aligned top-left as transformers' SDPA path aligns it).

What runs where:
  * No mask, no dropout, a head dim and dtype tileattn takes (for training: one its backward
    takes too, tileattn.api.backward_head_dims): tileattn, GQA without repeating k/v.
  * Anything else falls back to transformers' own SDPA path, with one warning per reason:
    a padding mask (variable-length batches are not supported yet), dropout, softcap or
    position bias, inputs that require grad at a head dim without a backward rung (the fallback
    keeps training correct), an unsupported head dim or dtype.
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
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


def _fallback(reason: str, module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"tileattn: {reason}; this call (and the ones like it) runs transformers' SDPA attention", stacklevel=3
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _unsupported(query, key, value, attention_mask, dropout, kwargs) -> str | None:
    if attention_mask is not None:
        return "an attention mask (padding) is not supported yet"
    if dropout:
        return "dropout is not supported"
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return "softcap / position bias are not supported yet"
    if query.dtype not in api._DTYPES or query.device.type != "cuda":
        return f"dtype {query.dtype} on {query.device} is not supported"
    dtype, D = api._DTYPES[query.dtype], query.shape[-1]
    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    if torch.is_grad_enabled() and needs_grad and D not in api.backward_head_dims(dtype):
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
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' SDPA path: a single query token attends to every key; otherwise causal is
    # aligned top-left (a static cache's unused slots sit after the keys in use).
    causal = "top_left" if (is_causal and query.shape[2] > 1) else False
    out = api.flash_attn_func(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scaling, causal=causal
    )
    return out, None  # (B, Nq, H, D), contiguous: what the model's o_proj reshapes


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

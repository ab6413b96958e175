"""Attention-kernel choices that keep training finite on current GPUs."""

from __future__ import annotations


def avoid_cudnn_attention() -> None:
    """Turn off PyTorch's cuDNN backend for scaled_dot_product_attention in this process.

    Its fused backward returns NaN in the query gradient on H100/H200 when an explicit mask
    is passed and the sequence length is 64 mod 128 (pytorch/pytorch#196678, a regression since
    torch 2.11 where cuDNN became the default backend for such inputs; TRL#7181 traces NaN
    DPO runs to it). Every left-padded training batch passes a mask, and the intermittent NaN
    gradient steps seen in 4 of 13 H200 jobs match it (the likely cause; not re-measured since).
    The flash and memory-efficient kernels, used instead, are clean on the same inputs."""
    import torch

    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


GROUPED_SDPA = "ait_grouped_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs):
    """transformers' SDPA attention without copying the KV cache for grouped-query attention.

    transformers repeats each key/value head for its query heads (`repeat_kv`) whenever a mask is
    passed, and our decoder and trainer always pass one (left padding). On a 135M model at batch
    64 those copies plus a one-query attention kernel were 70% of a decode step's GPU time on an
    H200. Here the G query heads that share a key/value head are folded into the query-length
    axis instead: query [b, kv_heads * G, t, d] -> [b, kv_heads, G * t, d], the mask repeated G
    times along its query axis (a broadcast when t = 1). Same math, no KV copy, G times fewer
    (and fuller) attention blocks. Anything this does not cover (no mask, a per-head mask,
    dropout, extra kwargs such as softcap) goes to transformers' own function."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask
    if (groups == 1 or mask is None or mask.dim() != 4 or mask.shape[1] != 1 or dropout
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or query.shape[1] != key.shape[1] * groups):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, t, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.reshape(b, kv_heads, groups * t, d)  # row g * t + i is query head (kv_head * G + g), position i
    if t > 1:
        mask = mask[:, :, None].expand(mask.shape[0], 1, groups, t, mask.shape[-1]).reshape(
            mask.shape[0], 1, groups * t, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask[..., :length], scale=scaling)
    return out.reshape(b, heads, t, value.shape[-1]).transpose(1, 2).contiguous(), None


def grouped_attention_name() -> str:
    """Register `grouped_sdpa` with transformers (idempotent) and return the name to pass as
    `attn_implementation`; plain "sdpa" on a transformers without the attention registries."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)  # 2D masks are built as for sdpa
    except (ImportError, AttributeError):
        return "sdpa"
    return GROUPED_SDPA

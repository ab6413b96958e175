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

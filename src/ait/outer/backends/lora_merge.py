"""The sampling model of the local backend kept equal to base + the agent's LoRA adapter, merged in place
(ait.outer.backends.local owns both models; this is how the adapter reaches the sampler after each step).

Why merged: a decode step of the unmerged peft model runs each adapted linear layer plus its
LoRA path (three more kernels, with dtype casts); merged, it is one matmul per layer, the
plain model's decode. The distribution is the same up to rounding: in fp32 (CPU) the two agree
to float precision; in bf16 the merged weight is the nearest bf16 value of W + delta, so a
delta entry under half a bf16 step of its W entry does not show. The unmerged bf16 forward
rounds the LoRA path's contribution into its bf16 output instead and loses about as much of a
tiny delta: on a random 896-wide model the two bf16 forwards differed by a KL of ~2e-5 per
token, as much as either differs from fp32. Either way the recorded logprobs are those of the
distribution actually sampled (the sampling model's), so the importance ratio stays exact and
`kl_sample_train` measures the sampler/trainer mismatch.
"""

from __future__ import annotations

import re
from typing import Any

_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+(?=\.)")


class LoraMerge:
    """Keeps `plain`, a copy of a peft model's base model taken before peft wrapped it, equal to
    base + the active adapters merged in; `merge()` (or calling it) rewrites it in place.

    Every LoRA layer of the peft model has a twin module at the same path in `plain`; its weight
    becomes the peft layer's base weight + get_delta_weight(adapter) for each active adapter
    (and its bias the base bias + the LoRA bias, with lora_bias). Every other trainable tensor
    (a modules_to_save copy, say) is copied to the `plain` parameter of the same name. Only the
    tensors' contents change (`copy_` / `add_`), never their identity. A target weight that
    `plain` shares with another module (lm_head tied to the embeddings) is untied first, so the
    merge changes that module only, as the adapter does. LoRA variants whose merge is not a
    plain delta (DoRA and the like) are refused."""

    def __init__(self, peft_model: Any, plain: Any):
        import torch
        from peft.tuners.lora import LoraLayer

        self.plain = plain
        inner = peft_model.get_base_model()
        modules = dict(plain.named_modules())
        users: dict[int, int] = {}
        for _, module in plain.named_modules(remove_duplicate=False):
            for _, q in module.named_parameters(recurse=False, remove_duplicate=False):
                users[id(q)] = users.get(id(q), 0) + 1

        def own(module: Any, attr: str) -> None:
            """A parameter of `plain` that the merge will change: untied from any other module."""
            q = getattr(module, attr)
            if users.get(id(q), 0) > 1:
                setattr(module, attr, torch.nn.Parameter(q.detach().clone(), requires_grad=False))

        self.merges: list[tuple[Any, Any]] = []  # (plain module, peft LoRA layer)
        covered: set[int] = set()
        for name, layer in inner.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            if getattr(layer, "lora_variant", None) or any(getattr(layer, "use_dora", {}).values()):
                raise NotImplementedError(f"{name}: a LoRA variant (DoRA, ...) cannot be merged into the "
                                          "sampling model")
            twin, base = modules.get(name), layer.get_base_layer()
            if twin is None or type(twin) is not type(base) or twin.weight.shape != base.weight.shape:
                raise ValueError(f"the sampling model has no layer matching the LoRA layer {name}")
            own(twin, "weight")
            if getattr(twin, "bias", None) is not None:
                own(twin, "bias")
            self.merges.append((twin, layer))
            covered.update(id(q) for q in layer.parameters())
        params = dict(plain.named_parameters())
        self.copies: list[tuple[Any, str, Any]] = []  # (plain module, attribute, source tensor)
        for name, q in inner.named_parameters():
            if not q.requires_grad or id(q) in covered:
                continue
            key = _MODULES_TO_SAVE.sub("", name)
            if key not in params or params[key].shape != q.shape:
                raise NotImplementedError(f"trainable tensor {name} has no counterpart in the sampling model")
            owner, _, attr = key.rpartition(".")
            module = modules[owner]
            own(module, attr)
            self.copies.append((module, attr, q))

    def merge(self, model: Any = None) -> None:
        import torch

        if model is not None and model is not self.plain:
            raise ValueError("LoraMerge updates the model it was built for")
        with torch.no_grad():
            for twin, layer in self.merges:
                base = layer.get_base_layer()
                twin.weight.copy_(base.weight)
                if getattr(base, "bias", None) is not None:
                    twin.bias.copy_(base.bias)
                if layer.merged or layer.disable_adapters:  # merged: the base weight holds the delta already
                    continue
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        twin.weight.add_(layer.get_delta_weight(adapter))
                        if getattr(layer, "lora_bias", {}).get(adapter):
                            twin.bias.add_(layer.lora_B[adapter].bias * layer.scaling[adapter])
                    elif adapter in layer.lora_embedding_A:
                        twin.weight.add_(layer.get_delta_weight(adapter))
            for module, attr, source in self.copies:
                getattr(module, attr).copy_(source)

    __call__ = merge

"""PyTorch's fused inference paths that multiply a layer's weights without calling the layer.

``nn.TransformerEncoderLayer`` in eval mode with nothing to differentiate runs
``torch._transformer_encoder_layer_fwd``, which reads ``linear1.weight`` and
``linear2.weight`` itself: an ``lcmac.nn.Linear`` put there would never run.  The layer
checks, before taking that path, that its activation is ReLU or GELU through the flag
``activation_relu_or_gelu`` it stashes at construction; clearing the flag sends the layer down
its ordinary path (``self.linear1(x)``, the same activation), which calls the swapped layers.
``nn.TransformerEncoder`` would also pack a padded batch into a nested tensor for that path
(``use_nested_tensor``), which the ordinary path of its layers then sees: that is turned off
for an encoder whose layers were changed.

``nn.MultiheadAttention`` always multiplies its projections itself
(``F.multi_head_attention_forward`` reads ``in_proj_weight`` and ``out_proj.weight``): its
``out_proj`` is an ``nn.Linear`` subclass that is never called, so swapping it would change
nothing; ``attention_projections`` names them for the report instead.
"""
from __future__ import annotations

from torch import nn

__all__ = ["attention_projections", "call_swapped_layers"]

#: why an attention projection is not swapped
ATTENTION_WHY = ("nn.MultiheadAttention multiplies {what} itself in "
                 "F.multi_head_attention_forward: a swapped layer would never run")


def attention_projections(name: str, mha: nn.MultiheadAttention) -> list[tuple]:
    """(name, (in, out), why, module) of the projections of ``mha`` (named ``name``): the
    packed or separate q/k/v weights (module None: parameters, not layers) and ``out_proj``."""
    prefix = f"{name}." if name else ""
    weights = ["in_proj_weight"] if mha._qkv_same_embed_dim else \
        ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
    found = []
    for w in weights:
        t = getattr(mha, w)
        found.append((prefix + w, (t.shape[1], t.shape[0]), ATTENTION_WHY.format(what=f"its {w}"),
                      None))
    o = mha.out_proj
    found.append((prefix + "out_proj", (o.in_features, o.out_features),
                  ATTENTION_WHY.format(what="out_proj.weight"), o))
    return found


def call_swapped_layers(model: nn.Module, is_swapped) -> list[str]:
    """Turn PyTorch's fused encoder path off wherever it would bypass a swapped layer
    (``is_swapped(module)``); the names of the encoder layers changed."""
    changed = {}
    for name, layer in model.named_modules():
        if isinstance(layer, nn.TransformerEncoderLayer) and layer.activation_relu_or_gelu and (
                is_swapped(layer.linear1) or is_swapped(layer.linear2)):
            layer.activation_relu_or_gelu = 0          # the fast path's own precondition
            changed[id(layer)] = name
    for enc in model.modules():
        if isinstance(enc, nn.TransformerEncoder) and any(id(x) in changed for x in enc.layers):
            enc.use_nested_tensor = False
    return list(changed.values())

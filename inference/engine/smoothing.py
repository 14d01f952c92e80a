"""SmoothQuant for int8 activations (quantization.py's fbgemm kernel): a few input channels carry most of the
activation range, which per-token int8 rounds the other channels against; the range is moved into the weights
before they are quantized, and the float model computes the same function."""
from __future__ import annotations

import torch
from torch import nn

CALIBRATION_TOKENS = 256
SMOOTHING_ALPHA = 0.5


@torch.inference_mode()
def smooth_activations(model, *, num_calibration_tokens: int = CALIBRATION_TOKENS, alpha: float = SMOOTHING_ALPHA,
                       ) -> None:
    """SmoothQuant, before quantizing: on the projections fed by an RMSNorm (q/k/v by input_layernorm, gate/up by
    post_attention_layernorm): a few input channels carry most of the activation range, which per-token int8
    rounds the other channels against. Each channel j is divided by s_j in the norm's weight and multiplied by s_j
    in the projections' weight columns (the float model computes the same function), with
    s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha), moving range from the activations into the weights. down_proj
    the same way through up_proj's rows (its input is act(gate) * up, linear in each up channel).

    max|x_j| is measured on one forward pass over fixed pseudo-random token ids: the outlier channels are a property
    of the model, not of the text (and no text needs to ship with the engine).
    """
    body = model.model
    num_tokens = min(num_calibration_tokens, model.config.max_position_embeddings)
    ids = torch.randint(0, model.config.vocab_size, (1, num_tokens), generator=torch.Generator().manual_seed(0))
    maxima: dict[nn.Module, torch.Tensor] = {}

    def channel_max(x: torch.Tensor) -> torch.Tensor:
        return x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0).float()  # [channels]

    hooks = []
    for layer in body.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            hooks.append(norm.register_forward_hook(
                lambda module, _inputs, output: maxima.__setitem__(module, channel_max(output))))
        hooks.append(layer.mlp.down_proj.register_forward_pre_hook(
            lambda module, inputs: maxima.__setitem__(module, channel_max(inputs[0]))))
    try:
        body(input_ids=ids.to(body.embed_tokens.weight.device))
    finally:
        for hook in hooks:
            hook.remove()
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm, projections in ((layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj)),
                                  (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj))):
            w_max = torch.stack([p.weight.detach().abs().amax(dim=0).float() for p in projections]).amax(dim=0)
            s = _smoothing(maxima[norm], w_max, alpha)
            norm.weight.data.div_(s.to(norm.weight.dtype))
            for projection in projections:
                projection.weight.data.mul_(s.to(projection.weight.dtype))
        # down's input is act(gate) * up, linear in up's output channel by channel: divide up's rows by s.
        down, up = mlp.down_proj, mlp.up_proj
        s = _smoothing(maxima[down], down.weight.detach().abs().amax(dim=0).float(), alpha)
        up.weight.data.div_(s.to(up.weight.dtype)[:, None])
        if up.bias is not None:
            up.bias.data.div_(s.to(up.bias.dtype))
        down.weight.data.mul_(s.to(down.weight.dtype))


def _smoothing(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    # SmoothQuant's per-channel factor: max|x|^alpha / max|w|^(1 - alpha), kept away from 0.
    return (x_max.clamp(min=1e-5) ** alpha / w_max.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)

"""A black-box estimate of effective weights, for a mixer that declares no `effective_weights`.

For one example x (1, T, C) at the mixer's input and its read-out y = mixer(x) (1, T, C), the
estimate of how much query row i reads position j is the norm of the Jacobian block

    n_ij = || d y_i / d x_j ||_F          (C x C, for j <= i; 0 above the diagonal)

normalised per row, p_ij = n_ij / sum_{l<=i} n_il: one (1, R, T) map per layer, as if the mixer
were one head. It is what the output at i is sensitive to, at this input, to first order: for a
linear-in-x mixer with fixed weights a_ij it is |a_ij| ||W_v||, so it recovers the attention map
up to the value projection's scale; for softmax and kernel mixers it also carries the
derivative through the scores (q_i.k_j changes with x_j), and it mixes all heads of the layer.
It is not the exact a_ij of a mixer's op and gives no read-out split (no SNR): measurements
made with it are labelled "jacobian estimate". Cost: one backward per query row of a batch of
C copies of the example, so `measure_jacobian_examples` examples (8) are used.
"""
from __future__ import annotations

import torch

JACOBIAN_EXAMPLES = 8  # examples the estimate is built on (each costs R * C backward passes)
LABEL = "jacobian estimate"


def _output(mixer, x: torch.Tensor) -> torch.Tensor:
    out = mixer(x)
    return out[0] if isinstance(out, tuple) else out


def jacobian_weights(mixer, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """p (1, R, T) float64 for query rows `rows` ((R,) long) of one example x (1, T, C)."""
    T, C = x.shape[1], x.shape[2]
    R = rows.numel()
    norms = torch.zeros(R, T, dtype=torch.float64, device=x.device)
    with torch.enable_grad():
        # C copies of the example, copy c carrying output channel c's gradient: one backward
        # per row gives that row's whole (C, T, C) Jacobian (no vmap, so any op works)
        xs = x.detach().expand(C, T, C).clone().requires_grad_(True)  # (C, T, C)
        y = _output(mixer, xs)  # (C, T, C)
        pick = torch.eye(C, device=x.device, dtype=y.dtype)  # (C, C)
        for r, i in enumerate(rows.tolist()):
            (g,) = torch.autograd.grad((y[:, i] * pick).sum(), xs, retain_graph=r < R - 1)  # (C, T, C)
            norms[r] = g.detach().to(torch.float64).square().sum((0, 2))  # (T,)
    n = norms.sqrt()
    causal = torch.arange(T, device=n.device)[None, :] <= rows.to(n.device)[:, None]  # (R, T)
    n = n * causal
    return (n / n.sum(-1, keepdim=True).clamp_min(1e-300))[None]  # (1, R, T)

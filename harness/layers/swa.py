"""Sliding-window softmax attention: exact softmax over the last W positions only.

Query i attends to the keys j with i - W < j <= i (ops.window_attention: blocks of W through
torch's fused attention with a band mask, O(T W)). Its state is its window's KV cache: W keys
and W values per head, 2 W d elements, whatever the sequence length; this is the baseline
of the recall-versus-state-size frontier (Zoology, Arora et al. 2023), the mixer whose state
grows exactly as the window is widened and holds nothing older.

Default window W = 32 (DEFAULT_WINDOW, model.options.window): at the default geometry (d_model 64,
one head) its cache, 2 * 32 * 64 = 4,096 elements a layer, matches the state of the
default linear mixers (64 * 64 + 64 = 4,160 for elu), so model=swa and model=elu compare at
equal state size; on the default recall task (64 positions, 4 pairs in the first 8, queries
at mostly short power-law gaps after them) most answers lie inside the window, the distant
ones do not, which is the trade-off the frontier measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness import checks, ops
from harness.layers.options import Options, only_here
from harness.layers.parts import merge_heads
from harness.layers.protocol import ProbeMemory
from harness.layers.registry import register
from harness.layers.softmax import SoftmaxAttention

DEFAULT_WINDOW = 32


@dataclass(frozen=True)
class WindowOptions(Options):
    # keys each query sees (its KV cache); None: DEFAULT_WINDOW. Refused on the mixers without one.
    window: Optional[int] = only_here(None)

    def check(self) -> None:
        checks.integer("model.options.window", self.window, nullable=True)


@register("swa")
class SlidingWindowAttention(SoftmaxAttention):
    core = "softmax_window"
    Options = WindowOptions
    monotone_in_score = False  # zero outside the window, whatever the score there

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        window = self.options_of(config).window
        self.window = DEFAULT_WINDOW if window is None else window

    def forward(self, x):  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        o = self.hook_out(ops.window_attention(q, k, v, self.window, scale=self.scale))  # (B, H, T, D)
        return self.out_proj(merge_heads(o))

    def state_size(self, sequence_length: int = 2048) -> int:
        """The window's KV cache: min(W, length) keys of d_qk and values of d_head per head."""
        return self.n_heads * ops.kv_cache_elements(min(self.window, sequence_length), self.d_qk, self.d_head)

    def effective_weights(self, hooks, rows=None):
        return ops.window_weights(hooks["q"], hooks["k"], self.window, scale=self.scale, rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """Exact softmax over the last DEFAULT_WINDOW stored keys: older pairs are gone."""
        return ProbeMemory(read="softmax", d_key=d, window=DEFAULT_WINDOW)

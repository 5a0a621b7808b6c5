"""2-D rotary position embedding (RoPE; Heo et al., ECCV 2024), axial and mixed, on timm's rotary pieces.

Each head's channels form ``d/2`` pairs ``(x_2c, x_2c+1)``; the pair of token ``i`` at cell
``(r, c)`` is rotated by an angle ``phi_c(p_i)``, so that ``q_i.k_j`` depends on the positions only
through ``phi(p_i) - phi(p_j) = phi(p_i - p_j)`` (angles are linear in the position):

* ``rope_axial`` (timm ``RotaryEmbeddingCat``, index grid): pairs ``0 .. d/4-1`` turn with the row,
  ``d/4 .. d/2-1`` with the column, ``phi = r f_c`` resp. ``c f_c``, ``f_c = theta^(-c / (d/4))``
  (``theta`` default 100). Fixed, no parameters.
* ``rope_mixed`` (timm ``RotaryEmbeddingMixed``): learned per-head frequencies of this layer,
  ``phi_c = fx[h, c] r + fy[h, c] c`` (init: ``theta^(-4c/d)`` magnitudes at a random angle per
  head, ``theta`` default 10); parameter ``rope.freqs`` ``(2, 1, H, d/2)``, kept out of weight decay.

Skip tokens (class, distillation) are not rotated. There is no score term: attention keeps the
fused SDPA kernel of plain attention. Needs ``d % 4 == 0``.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingMixed, apply_rot_embed_cat
from timm.layers.pos_embed_sincos import init_random_2d_freqs
from torch import Tensor

from .. import registry
from ..base import Description, PositionEncoding, offset_grid
from ..config import RPEConfig, RPEConfigError

__all__ = ["RotaryPositionEncoding"]

DEFAULT_THETA = {"rope_axial": 100.0, "rope_mixed": 10.0}


class RotaryPositionEncoding(PositionEncoding):
    """Rotates q and k by the 2-D RoPE angles of each token's grid cell (module docstring)."""

    rotates_qk = True
    keeps_own_init = True  # frequencies are not weights: no Xavier re-init (DETR), no weight decay

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        if head_dim % 4:
            raise RPEConfigError(
                f"rpe.method={config.method!r} needs a head dim divisible by 4 (two axes x sin/cos pairs),"
                f" got head_dim={head_dim}"
            )
        self.name = config.method
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.theta = config.theta if config.theta is not None else DEFAULT_THETA[config.method]
        self.mixed = config.method == "rope_mixed"
        if self.mixed:
            self.rope = RotaryEmbeddingMixed(
                head_dim * num_heads, depth=1, num_heads=num_heads, temperature=self.theta, grid_indexing="ij",
                device=device, dtype=dtype,
            )
        else:
            self.rope = RotaryEmbeddingCat(head_dim, temperature=self.theta, in_pixels=False, device=device)

    def embedding(self, h: int, w: int, skip: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """sin/cos of every token ``(n, 2d)`` (axial, cached per shape) or ``(H, n, 2d)`` (mixed); the ``skip``
        leading rows are the identity rotation (sin 0, cos 1), so q and k are rotated whole, without slicing.
        """
        if self.mixed:
            grid = self.rope.get_embed((h, w))[0].to(device=device, dtype=dtype)  # learned: per forward
            return _with_identity_rows(grid, skip)
        return self.cached(
            (h, w, skip, device, dtype),
            lambda: _with_identity_rows(self.rope.get_embed((h, w)).to(device=device, dtype=dtype), skip),
        )

    def rotate(self, q: Tensor, k: Tensor, h: int, w: int, skip: int) -> tuple[Tensor, Tensor]:
        # sin/cos stay float32 (or float64) for low-precision q, k; timm casts the rotated result back
        embed = self.embedding(h, w, skip, q.device, torch.float64 if q.dtype == torch.float64 else torch.float32)
        return apply_rot_embed_cat(q, embed), apply_rot_embed_cat(k, embed)

    def pair_frequencies(self) -> tuple[Tensor, Tensor]:
        """Per head and channel pair, the angle per unit row and per unit column step: two ``(Hs, d/2)``."""
        pairs = self.head_dim // 2
        if self.mixed:
            freqs = self.rope.freqs.detach()[:, 0]  # (2, H, d/2)
            return freqs[0], freqs[1]
        bands = self.rope.bands.detach().float()  # (d/4,)
        zeros = torch.zeros_like(bands)
        rows = torch.cat([bands, zeros]).view(1, pairs)
        cols = torch.cat([zeros, bands]).view(1, pairs)
        return rows, cols

    def describe(self, h: int, w: int) -> Description:
        """Panel: ``mean_c cos(phi_c(dr, dc))``, the logit a query gets from an equal key at offset ``(dr, dc)``
        when all channel pairs carry unit norm (1 at offset 0)."""
        fr, fc = self.pair_frequencies()
        dr, dc = offset_grid(h, w)
        angles = fr.float()[:, :, None, None] * dr + fc.float()[:, :, None, None] * dc  # (Hs, d/2, 2h-1, 2w-1)
        kernel = angles.cos().mean(1)
        kind = "mixed, learned per-head frequencies" if self.mixed else "axial, fixed frequencies"
        return Description(
            self.name, "qk", f"2-D RoPE ({kind}, theta {self.theta:g}): mean cos of the rotation angle",
            [("", kernel)], signed=True,
        )

    def reset_parameters(self) -> None:
        if self.mixed:
            with torch.no_grad():
                self.rope.freqs.copy_(init_random_2d_freqs(
                    self.head_dim, 1, self.num_heads, temperature=self.theta, device=self.rope.freqs.device,
                    dtype=self.rope.freqs.dtype,
                ))

    def no_weight_decay(self) -> set[str]:
        return {"rope.freqs"} if self.mixed else set()

    def extra_repr(self) -> str:
        return f"method={self.name!r}, theta={self.theta:g}, head_dim={self.head_dim}, heads={self.num_heads}"


def _with_identity_rows(embed: Tensor, skip: int) -> Tensor:
    """``embed`` ``(..., n_grid, 2d)`` [sin, cos] with ``skip`` identity rows (sin 0, cos 1) in front."""
    if skip == 0:
        return embed
    identity = torch.cat([embed.new_zeros(*embed.shape[:-2], skip, embed.shape[-1] // 2),
                          embed.new_ones(*embed.shape[:-2], skip, embed.shape[-1] // 2)], dim=-1)
    return torch.cat([identity, embed], dim=-2)


for _name, _summary in (
    ("rope_axial", "2-D RoPE, axial: half the channels turn with the row, half with the column"),
    ("rope_mixed", "2-D RoPE, mixed: learned per-head frequencies over row and column"),
):
    registry.register(registry.Encoding(
        _name, RotaryPositionEncoding.build, _summary, fields=("theta",), directed=True
    ))
    registry.register_preset(_name, RPEConfig(method=_name))

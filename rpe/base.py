"""The one interface every position encoding implements, and the factorised logit terms it returns.

Attention (`rpe.attention.rpe_attention`) never asks which encoding it holds; it asks each module
of an attention layer (``rpe_q``, ``rpe_k``, ``rpe_v``) for the hooks that module declares:

=================  ==========================================================================
hook               what it adds (per head, ``s = scale``, offsets query minus key)
=================  ==========================================================================
``rotate``         q, k -> rotated q, k before the dot product (RoPE); no score term, so the
                   fused SDPA kernel stays fused. Declared by ``rotates_qk = True``.
``logit_pieces``   additive terms of the scaled logits ``e_ij`` (a bias, or a contextual
                   ``(s q_i).r`` / ``(s k_j).r``), as `LogitPiece` (never ``(n, n, d)``).
                   Declared by ``adds_logits = True``.
``value_term``     ``z_i += sum_j a_ij r_ij`` from the probabilities. ``adds_value = True``.
``tokens``         the token grid between blocks (a conditional encoding such as CPVT's PEG);
                   called by the backbone, not by attention. ``edits_tokens = True``.
=================  ==========================================================================

Every module also has ``reset_parameters``, ``extra_repr`` and `PositionEncoding.describe`, which
tells tools (``scripts/plot_rpe.py``, ``scripts/make_tables.py``) what there is to draw or count.
What every encoding shares lives here as well: `PositionEncoding.build` (the registry's builder of an
encoding that is one module in the key slot) and `PositionEncoding.cached` (per-shape values such as
sin/cos or distance tables, on the same `ShapeCache` as the bucket ids of `rpe.index`).
See docs/design.md for the conventions and how to add an encoding.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Description",
    "LogitPiece",
    "PositionEncoding",
    "ShapeCache",
    "ONEHOT_DEVICES",
    "bucket_rows",
    "build_for_cache",
    "materialize_pieces",
    "no_weight_decay_names",
    "own_init_parameters",
    "offset_grid",
    "onehot_gather",
    "onehot_scatter",
]


@dataclass
class LogitPiece:
    """A term of the attention logits in factorised form.

    kind "table": ``values`` ``(Hs, nb)``, term ``values[h, ids[i, j]]``.
    kind "rows":  ``values`` ``(B, H, n, nb)``, term ``values[b, h, i, ids[i, j]]``.
    kind "dense": ``values`` broadcastable to ``(B, H, n, n)``, added as is (``ids`` unused).
    ``transposed`` swaps the pair: term(i, j) is the above evaluated at (j, i) (query-site terms).
    ``onehot`` (optional, "rows" only): ``(n, n, nb')`` one-hot of ``ids`` with ``nb'`` the width of
    ``values``; when given, the gather is a batched matrix product (`onehot_gather`).
    """

    kind: str
    values: Tensor
    ids: Tensor | None = None
    transposed: bool = False
    onehot: Tensor | None = None

    def materialize(self) -> Tensor:
        """The term as a tensor broadcastable to ``(B, H, n, n)``."""
        if self.kind == "dense":
            return self.values
        if self.kind == "table":
            term = self.values[:, self.ids].unsqueeze(0)  # (1, Hs, n, n)
        elif self.onehot is not None:
            term = onehot_gather(self.values, self.onehot)
        else:
            B, H, n, _ = self.values.shape
            term = torch.gather(self.values, -1, self.ids.expand(B, H, n, n))
        return term.transpose(-1, -2) if self.transposed else term


# Devices where the bucket gather and scatter-add run as batched one-hot matrix products: on CUDA
# that avoids atomics (deterministic gradients, fp32 accumulation) and measured faster; on CPU
# gather/scatter_add is faster (figures in docs/benchmarks.md).
ONEHOT_DEVICES = {"cuda"}


def onehot_gather(values: Tensor, onehot: Tensor) -> Tensor:
    """``term[b, h, i, j] = values[b, h, i, ids[i, j]]``: ``values`` ``(B, H, n, w)``, ``onehot``
    ``(n, n, w)`` -> ``(B, H, n, n)`` (a view with contiguous last dim), one ``(BH, w) @ (w, n)`` per query.
    """
    B, H, n, width = values.shape
    per_query = values.reshape(B * H, n, width).transpose(0, 1)  # (n, BH, w)
    return torch.bmm(per_query, onehot.transpose(1, 2)).transpose(0, 1).unflatten(0, (B, H))


def onehot_scatter(attn: Tensor, onehot: Tensor) -> Tensor:
    """``out[b, h, i, c] = sum_j attn[b, h, i, j] [ids[i, j] = c]``: ``(B, H, n, n)`` -> ``(B, H, n, w)``."""
    B, H, n, _ = attn.shape
    per_query = attn.reshape(B * H, n, n).transpose(0, 1)  # (n, BH, n)
    return torch.bmm(per_query, onehot).transpose(0, 1).unflatten(0, (B, H))


def bucket_rows(x: Tensor, table: Tensor, width: int) -> Tensor:
    """``x . r_b`` for every bucket: ``x`` ``(B, H, n, d)``, ``table`` ``(Hs, d, nb)`` -> ``(B, H, n, width)``;
    columns past ``nb`` are zero (padding to the one-hot width).
    """
    table = table.to(x.dtype)
    if width > table.shape[-1]:
        table = F.pad(table, (0, width - table.shape[-1]))
    return x @ table.unsqueeze(0)


def build_for_cache(build: Callable[[], Tensor]) -> Tensor:
    """``build()`` as an ordinary tensor even inside ``torch.inference_mode``: a value cached during an
    inference forward is reused by later forwards, and an inference tensor cannot be saved for backward.

    Inside ``torch.compile`` the value is a graph output (an inference tensor when the compiled call runs in
    inference mode), so the caches keep only values built outside compilation (``torch.compiler.is_compiling``);
    a compiled graph that met an empty cache computes the value itself.
    """
    with torch.inference_mode(False):
        return build()


class ShapeCache:
    """Values built once per key (a grid shape, device, dtype, ...), the ``size`` most recently used kept.

    Values are built with `build_for_cache`; one built while ``torch.compile`` traces is returned but not
    kept (see there). The bucket ids of `rpe.index` use one shared instance, every `PositionEncoding` its own.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[Hashable, Tensor] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Tensor]) -> Tensor:
        """The value kept for ``key``, else ``build()`` (kept unless compiling); do not modify it in place."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        value = build_for_cache(build)
        if not torch.compiler.is_compiling():
            self._values[key] = value
            self.resize(self.size)
        return value

    def resize(self, size: int) -> None:
        """Keep at most ``size`` (>= 1) values from now on, dropping the least recently used."""
        self.size = max(1, int(size))
        while len(self._values) > self.size:
            self._values.popitem(last=False)

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


def materialize_pieces(pieces: list[LogitPiece]) -> Tensor | None:
    """Sum of all pieces, broadcastable to ``(B, H, n, n)``; None for no pieces."""
    total = None
    for piece in pieces:
        term = piece.materialize()
        total = term if total is None else total + term
    return total


def offset_grid(h: int, w: int) -> tuple[Tensor, Tensor]:
    """Offsets of a ``(2h-1, 2w-1)`` heatmap: ``dr`` ``(2h-1, 1)`` and ``dc`` ``(1, 2w-1)`` long, increasing."""
    return torch.arange(-(h - 1), h)[:, None], torch.arange(-(w - 1), w)[None, :]


@dataclass
class Description:
    """What an encoding module is, for tools; no tool needs to know the module's class.

    ``panels``: named heatmaps ``(heads, 2h-1, 2w-1)`` over the offsets ``(dr, dc)`` of the
    requested grid (row ``dr + h-1``, column ``dc + w-1``) of what a pair with that offset gets;
    empty when there is nothing offset-shaped to draw. ``signed``: values are biases (diverging
    colours) rather than norms. ``buckets``: learned entries per table (None: not a lookup table).
    """

    name: str
    site: str
    summary: str
    panels: list[tuple[str, Tensor]] = field(default_factory=list)
    signed: bool = True
    buckets: int | None = None
    note: str = ""


class PositionEncoding(nn.Module):
    """Base class of every encoding module; the class attributes say which hooks it provides.

    An encoding that is one module in the key slot registers ``Cls.build`` (`build`); its constructor
    then takes ``(config, head_dim, num_heads, device=None, dtype=None)``, plus ``skip_bucket`` when
    ``has_skip_bucket``.
    """

    name: str = "?"
    site: str = "k"
    rotates_qk: bool = False
    adds_logits: bool = False
    adds_value: bool = False
    edits_tokens: bool = False
    uses_scaled_keys: bool = False  # logit_pieces reads ``s k``
    keeps_own_init: bool = False  # parameters that are not weights (frequencies): no backbone re-init
    has_skip_bucket: bool = False  # a lookup table that reserves a bucket for skip pairs (built with skip_bucket)

    def __init__(self) -> None:
        super().__init__()
        # created here, not on first use: a forward traced by torch.compile must not create attributes
        self._shape_cache = ShapeCache(16)

    @classmethod
    def build(
        cls, config: Any, head_dim: int, num_heads: int, *, skip_bucket: bool = True, device: Any = None,
        dtype: Any = None,
    ) -> tuple[None, PositionEncoding, None]:
        """`rpe.registry.Encoding.build` of an encoding that is one module in the key slot: ``(None, module, None)``."""
        extra = {"skip_bucket": skip_bucket} if cls.has_skip_bucket else {}
        return None, cls(config, head_dim, num_heads, device=device, dtype=dtype, **extra), None

    def cached(self, key: Hashable, build: Callable[[], Tensor]) -> Tensor:
        """``build()`` kept per ``key`` (include the device and dtype) by this module (`ShapeCache`, 16 keys);
        moving the module (``.to``, ``.cuda``, ``.double``) drops the kept values."""
        return self._shape_cache.get(key, build)

    def _apply(self, fn, *args, **kwargs):
        self._shape_cache.clear()
        return super()._apply(fn, *args, **kwargs)

    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of parameters to keep out of weight decay."""
        return set()

    def rotate(self, q: Tensor, k: Tensor, h: int, w: int, skip: int) -> tuple[Tensor, Tensor]:
        """Rotated ``q, k`` ``(B, H, n, d)``; the ``skip`` leading tokens stay as they are."""
        return q, k

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        """Terms added to the scaled logits; ``q_scaled``, ``k_scaled`` are ``s q``, ``s k`` ``(B, H, n, d)``."""
        return []

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor | None:
        """The logit term ``(B, H, n, n)`` computed the textbook way (the ``naive`` backend)."""
        return materialize_pieces(self.logit_pieces(q * scale, k * scale, h, w, skip, scale))

    def value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        """``(B, H, n, d)`` added to the output, from the probabilities ``attn`` ``(B, H, n, n)``."""
        raise NotImplementedError(f"{type(self).__name__} adds no value term")

    def naive_value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        return self.value_term(attn, h, w, skip)

    def value_tables(self, h: int, w: int, skip: int, device: torch.device) -> list[tuple[Tensor, Tensor]] | None:
        """The V term in factorised form, ``[(ids (n, n), table (Hs, nb, d))]`` with
        ``z_i += sum_j a_ij table[h, ids[i, j]]``; None when it is not a bucket lookup (fused kernels
        then cannot add it).
        """
        return None

    def tokens(self, x: Tensor, h: int, w: int, skip: int) -> Tensor:
        """Tokens ``(B, skip + h w, C)`` -> same shape (conditional encodings)."""
        return x

    def reset_parameters(self) -> None:
        """Re-initialise the parameters (no-op for fixed encodings)."""

    def describe(self, h: int, w: int) -> Description:
        """What this module adds, on an ``h x w`` grid (see `Description`)."""
        return Description(self.name, self.site, type(self).__name__)


def no_weight_decay_names(root: nn.Module) -> set[str]:
    """Full names of the parameters under ``root`` that its encodings keep out of weight decay."""
    return {
        f"{path}.{name}" if path else name
        for path, module in root.named_modules()
        if isinstance(module, PositionEncoding)
        for name in module.no_weight_decay()
    }


def own_init_parameters(root: nn.Module) -> set[int]:
    """``id`` of every parameter of an encoding with ``keeps_own_init`` (a backbone's blanket init skips them)."""
    return {
        id(p) for module in root.modules() if isinstance(module, PositionEncoding) and module.keeps_own_init
        for p in module.parameters()
    }


# Parameters of timm's own modules that carry position, by name: the absolute table (`pos_embed`) and the
# relative bias table that Swin's windowed attention keeps when its own bias is the encoding (rpe=swin);
# and by the submodule that holds them: Swin-v2's continuous position bias MLP (rpe=cpb on Swin-v2).
TIMM_POSITION_TABLES = ("pos_embed", "relative_position_bias_table")
TIMM_POSITION_MODULES = ("cpb_mlp",)


def position_parameters(root: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters under ``root`` that carry position: every parameter of an encoding module
    (bucket tables, RPE embeddings, RoPE frequencies, the CPB MLP, PEG convolutions) and the position tables
    that timm's own modules hold (`TIMM_POSITION_TABLES`: the APE, Swin's bias table; `TIMM_POSITION_MODULES`:
    Swin-v2's CPB MLP). The optimizer can give
    them a learning budget of their own (``pos_lr_scale`` in `models.classification`)."""
    seen: dict[int, nn.Parameter] = {}
    for module in root.modules():
        if isinstance(module, PositionEncoding):
            seen.update((id(p), p) for p in module.parameters())
    for name, p in root.named_parameters():
        *owners, leaf = name.split(".")
        if leaf in TIMM_POSITION_TABLES or any(owner in TIMM_POSITION_MODULES for owner in owners):
            seen[id(p)] = p
    return [p for p in seen.values() if p.requires_grad]

"""DETR checkpoints in the reference layout (official DETR and DETR with iRPE): load and export.

A reference checkpoint is ``{"model": state_dict, "args": argparse.Namespace, ...}`` with keys such as
``backbone.0.body.layer1.0.conv1.weight``, ``transformer.encoder.layers.{i}.self_attn.in_proj_weight``,
``transformer.encoder.layers.{i}.self_attn.rpe_k.lookup_table_weight``,
``transformer.decoder.layers.{i}.multihead_attn.*``, ``input_proj``, ``query_embed``, ``class_embed`` and
``bbox_embed.layers.{j}``. `reference_name` maps each of our parameter names to its reference name (one
table, used in both directions); the architecture comes from the checkpoint's ``args`` where present and
from the tensors' shapes otherwise (docs/detr_checkpoints.md).

Files are read with ``weights_only=True``; the only class they may name is ``argparse.Namespace``
(the reference's ``args``), so a file that needs any other code to load is refused in one line.

Class rows are loaded as they are: a reference model trained on COCO has ``max category id + 1`` = 91 real
classes whose label *is* the COCO category id (plus "no object"), unlike our contiguous labels;
`to_reference_checkpoint` can lay our rows out that way (``label_to_cat``).
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from models.checkpoint_files import RunConfigError, read_checkpoint_file
from storage.destinations import save_export

from .backbone import ResNetBackbone
from .detr import DETR
from .hyperparameters import BACKBONE_DEFAULTS

__all__ = [
    "ReferenceCheckpointError",
    "from_reference_checkpoint",
    "load_reference_state",
    "reference_name",
    "reference_state_dict",
    "to_reference_checkpoint",
]


class ReferenceCheckpointError(RunConfigError):
    """A reference-layout DETR checkpoint that cannot be read or does not fit the model; one line."""


# The reference code's own argparse defaults, for checkpoints whose ``args`` lack a field (not ours: a change of
# our defaults must not change how its files read).
REFERENCE_ARG_DEFAULTS: dict[str, Any] = {"dropout": 0.1, "aux_loss": True}

# Our ResNet body is one nn.Sequential; the reference keeps torchvision's child names.
RESNET_CHILDREN = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")

# (our name pattern, reference name template), tried in order; the first match wins. Backbone names
# depend on the backbone type and are handled in `reference_name`.
NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"position_embedding\.row\.(.+)", r"backbone.1.row_embed.\1"),
    (r"position_embedding\.col\.(.+)", r"backbone.1.col_embed.\1"),
    (r"transformer\.(encoder|decoder)\.(\d+)\.ffn\.(linear[12])\.(.+)", r"transformer.\1.layers.\2.\3.\4"),
    (r"transformer\.decoder\.(\d+)\.cross_attn\.(.+)", r"transformer.decoder.layers.\1.multihead_attn.\2"),
    (r"transformer\.(encoder|decoder)\.(\d+)\.(.+)", r"transformer.\1.layers.\2.\3"),
    (r"transformer\.encoder_norm\.(.+)", r"transformer.encoder.norm.\1"),
    (r"transformer\.decoder_norm\.(.+)", r"transformer.decoder.norm.\1"),
    (r"((?:input_proj|query_embed|class_embed|bbox_embed)\..+)", r"\1"),
)

# Released DETR-iRPE models use the product method; its bucket count (2 int(2 ratio) + 1)^2 gives the
# ratio only up to rounding, so only the ratios the reference documents are inferred from it.
PRODUCT_RATIO_OF_BUCKETS = {49: 1.9, 81: 2.0, 121: 2.5, 169: 3.0}
QKV = ("q", "k", "v")
# Bias of a class row no category uses: exp(-1e4 - max logit) is 0 in float32 (and float64).
ABSENT_CLASS_LOGIT = -1.0e4


def reference_name(name: str, model: DETR) -> str | None:
    """The reference's key for our state-dict key ``name``; None for keys the reference has no
    counterpart of (BatchNorm's ``num_batches_tracked``)."""
    if name.endswith("num_batches_tracked"):
        return None
    match = re.fullmatch(r"backbone\.body\.(\d+)\.(.+)", name)
    if match:
        index, rest = int(match.group(1)), match.group(2)
        child = RESNET_CHILDREN[index] if isinstance(model.backbone, ResNetBackbone) else str(index)
        return f"backbone.0.body.{child}.{rest}"
    for pattern, template in NAME_RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, template, name)
    raise ReferenceCheckpointError(f"parameter {name!r} has no reference-layout name")


def reference_state_dict(model: DETR, label_to_cat: list[int] | None = None) -> dict[str, Tensor]:
    """Our DETR's state dict under the reference's names (packed ``in_proj_weight``).

    With ``label_to_cat`` (our label -> category id), the class head is laid out as the reference's:
    row ``label_to_cat[l]`` holds our row ``l``, "no object" is the last of ``max id + 2`` rows, and
    the rows of absent ids get weight 0 and bias `ABSENT_CLASS_LOGIT`, whose softmax probability is
    exactly 0 in float32, so every probability the model gives stays the same.
    """
    out = {}
    for name, value in model.state_dict().items():
        ref = reference_name(name, model)
        if ref is not None:
            out[ref] = value.detach().clone()
    if label_to_cat is not None:
        if len(label_to_cat) != model.num_classes or len(set(label_to_cat)) != len(label_to_cat):
            raise ReferenceCheckpointError(
                f"label_to_cat has {len(label_to_cat)} category ids ({len(set(label_to_cat))} distinct), the model"
                f" {model.num_classes} classes"
            )
        weight, bias = out["class_embed.weight"], out["class_embed.bias"]
        rows = max(label_to_cat) + 2
        new_weight = weight.new_zeros(rows, weight.shape[1])
        new_bias = bias.new_full((rows,), ABSENT_CLASS_LOGIT)
        index = torch.tensor([*label_to_cat, rows - 1])
        new_weight[index], new_bias[index] = weight, bias
        out["class_embed.weight"], out["class_embed.bias"] = new_weight, new_bias
    return out


def reference_args(model: DETR) -> argparse.Namespace:
    """The reference's ``args`` fields that describe ``model``'s architecture."""
    attn = model.transformer.encoder[0].self_attn if len(model.transformer.encoder) else None
    rpe = attn.rpe_cfg if attn is not None else None
    backbone = model.backbone
    kind = {"PositionEmbeddingSine": "sine", "PositionEmbeddingLearned": "learned"}.get(
        type(model.position_embedding).__name__, "none"
    )
    return argparse.Namespace(
        backbone=backbone.name if isinstance(backbone, ResNetBackbone) else "tiny",
        dilation=False,
        position_embedding=kind,
        hidden_dim=model.transformer.dim,
        nheads=model.transformer.decoder[0].self_attn.num_heads,
        enc_layers=len(model.transformer.encoder),
        dec_layers=len(model.transformer.decoder),
        dim_feedforward=model.transformer.decoder[0].ffn.linear1.out_features,
        num_queries=model.query_embed.num_embeddings,
        pre_norm=model.transformer.encoder_norm is not None,
        aux_loss=model.aux_loss,
        enc_rpe2d=reference_flag(rpe),
    )


def reference_flag(rpe: Any) -> str:
    """The reference's ``enc_rpe2d`` for an `rpe.RPEConfig` (``""`` without RPE): its spelling (``euc``,
    ``2.0``) for the methods it has; our shorthand for the others, which only this project reads."""
    if rpe is None:
        return ""
    if rpe.method in ("euclidean", "quant", "cross", "product") and rpe.index == "piecewise":
        method = "euc" if rpe.method == "euclidean" else rpe.method
        return f"rpe-{rpe.ratio}-{method}-{rpe.mode}-{int(rpe.shared_head)}-{rpe.on}"
    return rpe.shorthand()


def to_reference_checkpoint(model: DETR, path: str | Path, label_to_cat: list[int] | None = None) -> Path:
    """Write ``{"model": reference-layout state dict, "args": Namespace}`` to ``path`` atomically.

    The reference's own ``main.py --resume <path> --eval`` loads it (with the matching architecture
    flags, e.g. ``--enc_rpe2d``, which ``args`` records). Its COCO evaluation reads a label as a category
    id: pass the data's ``label_to_cat`` to lay the class rows out that way (`reference_state_dict`);
    without it they are written as they are. A ``path`` inside a run's dir or a data root is refused in one
    `ReferenceCheckpointError` line (`storage.destinations`).
    """
    return save_export({"model": reference_state_dict(model, label_to_cat), "args": reference_args(model)}, path,
                       "to_reference_checkpoint", ReferenceCheckpointError)


def load_reference_state(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(state dict, args as a dict)`` of a reference checkpoint, read with ``weights_only=True``.

    Only ``argparse.Namespace`` is allowed beyond tensors and plain containers; the ``model`` dict may
    also be the whole file (a bare state dict). Raises `ReferenceCheckpointError` (one line).
    """
    checkpoint = read_checkpoint_file(path, safe_globals=[argparse.Namespace], error=ReferenceCheckpointError)
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict):
        state, args = checkpoint["model"], checkpoint.get("args")
    elif isinstance(checkpoint, dict) and checkpoint and all(isinstance(v, Tensor) for v in checkpoint.values()):
        state, args = checkpoint, None
    elif isinstance(checkpoint, dict) and "model" in checkpoint:  # there, but no mapping of names to tensors
        kind = type(checkpoint["model"]).__name__
        raise ReferenceCheckpointError(f"checkpoint {path}: its 'model' entry is a {kind}, not a state dict;"
                                       " expected a DETR / DETR-iRPE checkpoint")
    else:
        raise ReferenceCheckpointError(
            f"checkpoint {path} holds no 'model' state dict; expected a DETR / DETR-iRPE checkpoint"
        )
    state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from a DDP wrapper
    if args is not None and not isinstance(args, (argparse.Namespace, dict)):
        raise ReferenceCheckpointError(f"checkpoint {path}: 'args' is a {type(args).__name__}, not a Namespace")
    return state, dict(vars(args) if isinstance(args, argparse.Namespace) else args or {})


def _layer_count(state: dict[str, Tensor], prefix: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(found) + 1 if found else 0


def refuse_dc5(args: dict[str, Any], path: str | Path) -> None:
    """DC5 models (a dilated last stage) have the same tensors as the stride-32 ones; only ``args`` tell."""
    if args.get("dilation"):
        raise ReferenceCheckpointError(
            f"checkpoint {path} is a DC5 model (args.dilation=True); only the stride-32 backbones are supported"
        )


def _infer_backbone(state: dict[str, Tensor], args: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The backbone options of the checkpoint: a torchvision ResNet (by name or block counts) or ``tiny``."""
    refuse_dc5(args, path)
    name = args.get("backbone")
    if name is None and "backbone.0.body.conv1.weight" in state:
        blocks = _layer_count(state, "backbone.0.body.layer3.")
        bottleneck = "backbone.0.body.layer1.0.conv3.weight" in state
        name = {(True, 6): "resnet50", (True, 23): "resnet101", (False, 2): "resnet18", (False, 6): "resnet34"}.get(
            (bottleneck, blocks)
        )
        if name is None:
            raise ReferenceCheckpointError(f"checkpoint {path}: no known ResNet has {blocks} blocks in layer3")
    if name == "tiny" or (name is None and "backbone.0.body.0.weight" in state):
        # TinyBackbone: [conv, bn, relu] per conv; the stride-2 convs of later widths sit at 3, 9, 15, ...
        convs = sorted(
            (int(m.group(1)), v)
            for k, v in state.items()
            if (m := re.fullmatch(r"backbone\.0\.body\.(\d+)\.weight", k)) and v.dim() == 4
        )
        channels = [v.shape[0] for i, v in convs if i == 0 or (i - 3) % 6 == 0]
        return {"name": "tiny", "channels": channels, "stem_stride": convs[0][1].shape[-1]}
    if name is None:
        raise ReferenceCheckpointError(f"checkpoint {path} has no backbone.0.body.* weights and no args.backbone")
    return {"name": name, "norm": "frozen_bn"}


def _infer_enc_rpe(state: dict[str, Tensor], path: str | Path) -> str | None:
    """The reference flag of the encoder's RPE tables in ``state`` (product method assumed), or None."""
    prefix = "transformer.encoder.layers.0.self_attn.rpe_"
    sites = [s for s in QKV if any(k.startswith(f"{prefix}{s}.") for k in state)]
    if not sites:
        return None
    tables = {
        s: state.get(f"{prefix}{s}.lookup_table_weight", state.get(f"{prefix}{s}.lookup_table_bias")) for s in sites
    }
    if any(t is None for t in tables.values()):
        raise ReferenceCheckpointError(
            f"checkpoint {path}: the encoder RPE tables are not product tables; pass enc_rpe2d='rpe-...'"
        )
    mode = "bias" if f"{prefix}{sites[0]}.lookup_table_bias" in state else "ctx"
    first = tables[sites[0]]
    buckets = first.shape[1] if mode == "bias" or sites[0] == "v" else first.shape[2]
    if buckets not in PRODUCT_RATIO_OF_BUCKETS:
        known = ", ".join(f"{n} (ratio {r})" for n, r in PRODUCT_RATIO_OF_BUCKETS.items())
        raise ReferenceCheckpointError(
            f"checkpoint {path}: cannot infer the encoder RPE from tables of {buckets} buckets (known product"
            f" tables: {known}); pass enc_rpe2d='rpe-{{ratio}}-{{method}}-{{mode}}-{{shared}}-{{on}}'"
        )
    shared = int(first.shape[0] == 1)
    return f"rpe-{PRODUCT_RATIO_OF_BUCKETS[buckets]}-product-{mode}-{shared}-{''.join(sites)}"


def _infer_heads(state: dict[str, Tensor], args: dict[str, Any], hidden: int) -> int:
    """args.nheads; else from a per-head or contextual RPE table; else DETR's 8."""
    if args.get("nheads"):
        return int(args["nheads"])
    for site in QKV:
        prefix = f"transformer.encoder.layers.0.self_attn.rpe_{site}."
        table = state.get(prefix + "lookup_table_weight", state.get(prefix + "lookup_table_bias"))
        if table is None:
            continue
        if table.shape[0] > 1:
            return table.shape[0]
        if table.dim() == 3:
            return hidden // table.shape[2 if site == "v" else 1]
    return 8


def architecture(
    state: dict[str, Tensor], args: dict[str, Any], enc_rpe2d: str | None, path: str | Path
) -> dict[str, Any]:
    """`DETR` keyword arguments for a reference checkpoint (args first, shapes otherwise)."""
    for key in ("query_embed.weight", "class_embed.weight", "transformer.decoder.layers.0.linear1.weight"):
        if key not in state:
            raise ReferenceCheckpointError(f"checkpoint {path} has no {key!r}; expected a DETR / DETR-iRPE checkpoint")
    hidden = state["query_embed.weight"].shape[1]
    if enc_rpe2d is None:
        flag = args.get("enc_rpe2d")
        enc_rpe2d = flag if isinstance(flag, str) and flag else _infer_enc_rpe(state, path)
    position = args.get("position_embedding")
    if position is None:
        position = "learned" if "backbone.1.row_embed.weight" in state else "sine"
    kinds = {"sine": "sine", "v2": "sine", "learned": "learned", "v3": "learned", "none": "none"}
    if position not in kinds:
        raise ReferenceCheckpointError(
            f"checkpoint {path}: args.position_embedding={position!r} is not one of {', '.join(kinds)}"
        )
    return {
        "num_classes": state["class_embed.weight"].shape[0] - 1,
        "backbone": _infer_backbone(state, args, path),
        "position_embedding": kinds[position],
        "hidden_dim": hidden,
        "nheads": _infer_heads(state, args, hidden),
        "enc_layers": _layer_count(state, "transformer.encoder.layers."),
        "dec_layers": _layer_count(state, "transformer.decoder.layers."),
        "dim_feedforward": state["transformer.decoder.layers.0.linear1.weight"].shape[0],
        "dropout": float(args.get("dropout", REFERENCE_ARG_DEFAULTS["dropout"])),
        "num_queries": state["query_embed.weight"].shape[0],
        "pre_norm": bool(args.get("pre_norm", "transformer.encoder.norm.weight" in state)),
        "aux_loss": bool(args.get("aux_loss", REFERENCE_ARG_DEFAULTS["aux_loss"])),
        "enc_rpe": enc_rpe2d or None,
    }


def _pack_qkv(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Separate ``{q,k,v}_proj_weight`` (nn.MultiheadAttention with unequal kdim/vdim) -> packed ``in_proj_weight``."""
    out = dict(state)
    for key in [k for k in state if k.endswith(".q_proj_weight")]:
        base = key.removesuffix("q_proj_weight")
        parts = [f"{base}{s}_proj_weight" for s in QKV]
        if all(p in out for p in parts) and f"{base}in_proj_weight" not in out:
            out[f"{base}in_proj_weight"] = torch.cat([out.pop(p) for p in parts])
    return out


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:6])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > 6 else shown


def load_into(model: DETR, state: dict[str, Tensor], path: str | Path, describe: str = "") -> None:
    """Copy a reference-layout ``state`` into ``model``; every key must be used and every tensor fit.

    Raises `ReferenceCheckpointError` naming the missing, unexpected or mis-shaped keys (one line).
    """
    state = _pack_qkv(state)
    ours = model.state_dict()
    names = {name: reference_name(name, model) for name in ours}
    missing = [ref for ref in names.values() if ref is not None and ref not in state]
    unexpected = sorted(set(state) - set(names.values()) - {k for k in state if k.endswith("num_batches_tracked")})
    if missing or unexpected:
        parts = [f"missing keys {_listed(missing)}"] if missing else []
        parts += [f"unexpected keys {_listed(unexpected)}"] if unexpected else []
        raise ReferenceCheckpointError(f"checkpoint {path} does not fit {describe or 'the model'}: {'; '.join(parts)}")
    mapped = {}
    for name, ref in names.items():
        if ref is None:
            mapped[name] = ours[name]
            continue
        if state[ref].shape != ours[name].shape:
            raise ReferenceCheckpointError(
                f"checkpoint {path}: {ref} has shape {tuple(state[ref].shape)}, the model expects"
                f" {tuple(ours[name].shape)} ({describe or 'the model'})"
            )
        mapped[name] = state[ref]
    model.load_state_dict(mapped, strict=True)


# args fields that fix the architecture, and the `DETR` argument each one must agree with.
ARGS_TO_KWARGS = {
    "hidden_dim": "hidden_dim",
    "nheads": "nheads",
    "enc_layers": "enc_layers",
    "dec_layers": "dec_layers",
    "dim_feedforward": "dim_feedforward",
    "num_queries": "num_queries",
    "pre_norm": "pre_norm",
}


def check_args(args: dict[str, Any], kwargs: dict[str, Any], path: str | Path) -> None:
    """Refuse (one line) a model whose architecture differs from the checkpoint's ``args`` where the
    tensors' shapes could not tell (``nheads``, the RPE flag...)."""
    from rpe import resolve_rpe

    refuse_dc5(args, path)
    for field, name in ARGS_TO_KWARGS.items():
        if field in args and name in kwargs and args[field] != kwargs[name]:
            raise ReferenceCheckpointError(
                f"checkpoint {path} was trained with {field}={args[field]!r}, the model has {name}={kwargs[name]!r}"
            )
    if isinstance(args.get("enc_rpe2d"), str):
        theirs, ours = resolve_rpe(args["enc_rpe2d"] or None), resolve_rpe(kwargs.get("enc_rpe"))
        if theirs.shorthand() != ours.shorthand() or (ours.enabled and ours.index != theirs.index):
            raise ReferenceCheckpointError(
                f"checkpoint {path} was trained with enc_rpe2d={args['enc_rpe2d']!r}, the model's encoder RPE is"
                f" {ours.shorthand()!r}"
            )


def _describe(kwargs: dict[str, Any]) -> str:
    rpe = kwargs.get("enc_rpe")
    name = (kwargs.get("backbone") or {}).get("name", BACKBONE_DEFAULTS.name)
    return (
        f"DETR({name}, {kwargs.get('enc_layers')}+{kwargs.get('dec_layers')} layers,"
        f" width {kwargs.get('hidden_dim')}, encoder RPE {rpe if rpe else 'none'})"
    )


def build_detr(**kwargs: Any) -> DETR:
    """`DETR` without the warning about a frozen-BN ResNet lacking a backbone checkpoint: the whole
    model's weights follow."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*frozen BatchNorm but no backbone checkpoint.*")
        return DETR(**kwargs)


def load_reference_weights(path: str | Path, kwargs: dict[str, Any]) -> DETR:
    """`DETR` built from ``kwargs`` (the config's architecture) holding the checkpoint's weights.

    The checkpoint's class rows decide ``num_classes``; everything else must agree with ``args`` and
    fit key for key and shape for shape, else `ReferenceCheckpointError` (one line).
    """
    state, args = load_reference_state(path)
    if "class_embed.weight" not in state:
        raise ReferenceCheckpointError(f"checkpoint {path} has no 'class_embed.weight'; expected a DETR checkpoint")
    kwargs = {**kwargs, "num_classes": state["class_embed.weight"].shape[0] - 1}
    check_args(args, kwargs, path)
    model = build_detr(**kwargs)
    load_into(model, state, path, _describe(kwargs))
    return model


def from_reference_checkpoint(path: str | Path, enc_rpe2d: str | None = None, **overrides: Any) -> DETR:
    """Our `DETR`, in eval mode, holding a reference-layout checkpoint's weights.

    Args:
        path: ``{"model": state_dict, "args": Namespace, ...}`` as the DETR / DETR-iRPE code saves it.
        enc_rpe2d: the reference's encoder RPE flag (``rpe-2.0-product-ctx-1-k``); by default
            ``args.enc_rpe2d``, else inferred from the encoder's RPE tables (product method).
        **overrides: `DETR` keyword arguments that replace the inferred ones (``backbone``, ``nheads``...).

    ``forward(images (B, 3, H, W), mask (B, H, W))`` then gives the reference's ``pred_logits``
    (B, Q, C+1), ``pred_boxes`` (B, Q, 4) and ``aux_outputs``.
    """
    state, args = load_reference_state(path)
    kwargs = {**architecture(state, args, enc_rpe2d, path), **overrides}
    model = build_detr(**kwargs)
    load_into(model, state, path, _describe(kwargs))
    return model.eval()

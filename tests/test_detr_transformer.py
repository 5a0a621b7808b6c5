"""DETR's transformer with RPE: padding invariance of the encoder, RPE sites, initialisation."""

from __future__ import annotations

import pytest
import torch

from models.detr import DETR, DecoderCrossRPEError, DetectionModule, Transformer
from models.detr.backbone import PositionEmbeddingSine, build_position_encoding, downsample_mask

DIM, HEADS = 32, 4


def _encoder(rpe: str | None) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(DIM, HEADS, enc_layers=2, dec_layers=1, ffn=64, dropout=0.0, enc_rpe=rpe)
    return model.eval()


@pytest.mark.parametrize("rpe", ["rpe-2.0-product-ctx-1-k", "irpe_qkv", "irpe_bias_k", "none"])
def test_encoder_on_padded_batch_equals_each_image_alone(rpe: str) -> None:
    """Valid cells keep their integer positions in the padded grid, so RPE terms of valid pairs are
    unchanged and padded keys are masked: encoder outputs on valid cells match the lone images."""
    model = _encoder(rpe)
    pos_enc = PositionEmbeddingSine(DIM)
    gen = torch.Generator().manual_seed(1)
    sizes = [(5, 7), (3, 4)]
    big_h, big_w = 5, 7
    feats = torch.randn(2, DIM, big_h, big_w, generator=gen)  # padded cells hold garbage on purpose
    mask = torch.ones(2, big_h, big_w, dtype=torch.bool)
    for i, (h, w) in enumerate(sizes):
        mask[i, :h, :w] = False
    with torch.no_grad():
        batch_out = model.encode(feats, mask, pos_enc(mask)).view(2, big_h, big_w, DIM)
        for i, (h, w) in enumerate(sizes):
            alone_feats = feats[i : i + 1, :, :h, :w]
            alone_mask = torch.zeros(1, h, w, dtype=torch.bool)
            alone = model.encode(alone_feats, alone_mask, pos_enc(alone_mask)).view(h, w, DIM)
            torch.testing.assert_close(batch_out[i, :h, :w], alone, atol=1e-5, rtol=1e-5)


def test_encoder_rpe_changes_the_output() -> None:
    """Sanity: the RPE path is actually used (same weights, RPE tables non-zero)."""
    feats = torch.randn(1, DIM, 4, 5)
    mask = torch.zeros(1, 4, 5, dtype=torch.bool)
    pos = PositionEmbeddingSine(DIM)(mask)
    with_rpe = _encoder("rpe-2.0-product-ctx-1-k")
    without = _encoder(None)
    without.load_state_dict(with_rpe.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(with_rpe.encode(feats, mask, pos), without.encode(feats, mask, pos))


def test_rpe_sites_names_and_xavier_init() -> None:
    model = Transformer(
        DIM,
        HEADS,
        enc_layers=2,
        dec_layers=2,
        ffn=64,
        enc_rpe="rpe-1.9-product-ctx-1-k",
        dec_self_rpe="irpe_k",
    )
    names = [n for n, _ in model.named_parameters() if ".rpe_" in n]
    assert "encoder.0.self_attn.rpe_k.lookup_table_weight" in names
    assert "encoder.1.self_attn.rpe_k.lookup_table_weight" in names
    assert "decoder.0.self_attn.rpe_k.lookup_table_weight" in names
    assert not any("cross_attn.rpe" in n for n in names)
    table = model.encoder[0].self_attn.rpe_k.lookup_table_weight
    # 7x7 product buckets (the RPE library may append its unused skip bucket: DETR has no skip tokens).
    assert table.shape[-1] in (49, 50)
    assert table.abs().sum() > 0  # Xavier-uniform like every >1-d parameter, not zeros
    # Each layer owns its table.
    assert table.data_ptr() != model.encoder[1].self_attn.rpe_k.lookup_table_weight.data_ptr()


def test_decoder_cross_rpe_is_rejected_in_one_line() -> None:
    with pytest.raises(DecoderCrossRPEError) as err:
        Transformer(DIM, HEADS, enc_layers=1, dec_layers=1, ffn=64, dec_cross_rpe="irpe_k")
    assert "\n" not in str(err.value) and "dec_cross_rpe" in str(err.value)
    Transformer(DIM, HEADS, enc_layers=1, dec_layers=1, ffn=64, dec_cross_rpe="none")  # explicit none is fine


@pytest.mark.parametrize("kind", ["sine", "learned", "none"])
def test_detr_forward_shapes(kind: str) -> None:
    model = DETR(
        num_classes=3,
        backbone={"name": "tiny", "channels": [8, 16]},
        position_embedding=kind,
        hidden_dim=DIM,
        nheads=HEADS,
        enc_layers=1,
        dec_layers=2,
        dim_feedforward=64,
        num_queries=5,
        enc_rpe="irpe_k",
    )
    images = torch.randn(2, 3, 30, 26)
    mask = torch.zeros(2, 30, 26, dtype=torch.bool)
    mask[1, 20:, :] = True
    out = model(images, mask)
    assert out["pred_logits"].shape == (2, 5, 4)
    assert (
        out["pred_boxes"].shape == (2, 5, 4) and 0 <= out["pred_boxes"].min() <= out["pred_boxes"].max() <= 1
    )
    assert len(out["aux_outputs"]) == 1


def test_sine_encoding_depends_only_on_the_valid_region() -> None:
    mask = torch.ones(1, 6, 8, dtype=torch.bool)
    mask[0, :4, :5] = False
    padded = PositionEmbeddingSine(16)(mask)[0, :, :4, :5]
    alone = PositionEmbeddingSine(16)(torch.zeros(1, 4, 5, dtype=torch.bool))[0]
    torch.testing.assert_close(padded, alone)
    assert build_position_encoding("none", 16)(mask).abs().sum() == 0
    assert downsample_mask(mask, (3, 4)).shape == (1, 3, 4)


def test_enc_rpe2d_shorthand_overrides_the_rpe_group() -> None:
    small = {
        "backbone": {"name": "tiny", "channels": [8, 16]},
        "hidden_dim": DIM,
        "nheads": HEADS,
        "enc_layers": 1,
        "dec_layers": 1,
        "dim_feedforward": 64,
        "num_queries": 4,
    }
    plain = DetectionModule(rpe={"preset": "none"}, num_classes=2, **small)
    assert not any(".rpe_" in n for n, _ in plain.named_parameters())
    module = DetectionModule(
        rpe={"preset": "none"}, num_classes=2, enc_rpe2d="rpe-2.0-product-ctx-1-k", **small
    )
    table = module.model.transformer.encoder[0].self_attn.rpe_k.lookup_table_weight
    assert table.shape[0] == 1 and table.shape[-1] in (81, 82)  # shared head, 9x9 product buckets
    assert module.model.transformer.decoder[0].self_attn.rpe_cfg is None  # decoder self-attn off by default

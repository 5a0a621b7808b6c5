"""CPVT's PEG (model.net.ape=peg): the token-grid hook against a naive float64 convolution and against timm's
own PEG (`timm.models.twins.PosConv`) for the same weights, the DeiT wiring (blocks it follows, class token
untouched, errors) and a short command-line training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from timm.models.twins import PosConv

from models import ModelConfigError, create_model
from rpe.encodings.peg import PEG
from tests.helpers import SMALL_RELATIONAL, run_cli


def naive_peg(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: int, w: int, skip: int) -> torch.Tensor:
    """out_i = x_i + b + sum_{|dy|,|dx| <= 1} W[:, dy+1, dx+1] * x_(r+dy, c+dx) (zero outside) on grid tokens."""
    out = x.clone()
    for r in range(h):
        for c in range(w):
            acc = bias.clone().expand(x.shape[0], -1)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    if 0 <= r + dy < h and 0 <= c + dx < w:
                        acc = acc + weight[:, 0, dy + 1, dx + 1] * x[:, skip + (r + dy) * w + (c + dx)]
            out[:, skip + r * w + c] = x[:, skip + r * w + c] + acc
    return out


def test_tokens_match_naive_convolution_with_gradients() -> None:
    h, w, skip, dim = 3, 5, 1, 4
    peg = PEG(dim, dtype=torch.float64)
    torch.manual_seed(0)
    x = torch.randn(2, skip + h * w, dim, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, skip + h * w, dim, dtype=torch.float64)
    params = [x, peg.proj.weight, peg.proj.bias]
    out = peg.tokens(x, h, w, skip)
    expected = naive_peg(x, peg.proj.weight, peg.proj.bias, h, w, skip)
    assert torch.allclose(out, expected, atol=1e-12)
    assert torch.equal(out[:, :skip], x[:, :skip])  # the class token passes unchanged
    for got, want in zip(torch.autograd.grad((out * target).sum(), params),
                         torch.autograd.grad((expected * target).sum(), params), strict=True):
        assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize(("h", "w"), [(4, 4), (3, 5)])
def test_tokens_match_timm_posconv_with_gradients(h: int, w: int) -> None:
    """timm's ``PosConv`` (stride 1: ``x + DWConv3x3(x)`` over an ``(h, w)`` token grid, no class token) with our
    conv weights copied in; ours runs with a class token in front, which passes unchanged. Float64, forward and
    the gradients of the tokens, the conv weight and its bias; measured max |diff| 0 (forward) and 0 (grads)."""
    dim, skip = 6, 1
    peg = PEG(dim, dtype=torch.float64)
    timm_peg = PosConv(dim, dim, dtype=torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        peg.proj.weight.normal_()
        peg.proj.bias.normal_()
        timm_peg.proj[0].weight.copy_(peg.proj.weight)
        timm_peg.proj[0].bias.copy_(peg.proj.bias)
    x = torch.randn(2, skip + h * w, dim, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, skip + h * w, dim, dtype=torch.float64)

    def run(fn, conv):
        out = fn()
        return out.detach(), torch.autograd.grad((out * target).sum(), [x, conv.weight, conv.bias])

    expected, expected_grads = run(lambda: torch.cat([x[:, :skip], timm_peg(x[:, skip:], (h, w))], 1), timm_peg.proj[0])
    out, grads = run(lambda: peg.tokens(x, h, w, skip), peg.proj)
    assert (out - expected).abs().max() <= 1e-12
    for got, want in zip(grads, expected_grads, strict=True):
        assert (got - want).abs().max() <= 1e-12


def test_deit_with_pegs_after_chosen_blocks() -> None:
    net = create_model("deit_micro_patch4_32", rpe="none", ape="peg", peg_blocks=[0, 2], num_classes=4)
    assert net.pos_embed is None and sorted(net.pegs) == ["0", "2"]
    seen = []
    for index, peg in net.pegs.items():  # record which PEG's token-grid hook the forward calls
        peg.tokens = lambda *args, i=index, hook=peg.tokens: seen.append(i) or hook(*args)
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    assert seen == ["0", "2"]
    assert net.pegs["0"].proj.weight.grad is not None
    seen.clear()  # timm's forward_intermediates (features_only) runs the blocks itself: the PEGs follow them there too
    with torch.no_grad():
        images = torch.randn(1, 3, 32, 32)
        torch.testing.assert_close(net.forward_intermediates(images)[0], net.forward_features(images))
    assert seen == ["0", "2", "0", "2"]
    assert sorted(create_model("deit_micro_patch4_32", ape="peg", num_classes=4).pegs) == ["0"]  # CPVT's default
    for kwargs, fragment in [({"ape": "peg", "peg_blocks": [4]}, "block indices in 0..3"),
                             ({"ape": "learned", "peg_blocks": [0]}, "needs ape=peg")]:
        with pytest.raises(ModelConfigError, match=fragment):
            create_model("deit_micro_patch4_32", num_classes=4, **kwargs)
    with pytest.raises(ModelConfigError, match="valid: ape=none"):
        create_model("swin_micro_patch4_window4_32", num_classes=4, peg_blocks=[0])


@pytest.mark.slow  # a train.py process; the DeiT wiring above (forward and backward) stays in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    result = run_cli("train.py", [
        "rpe=none", "model.net.ape=peg", "model.net.peg_blocks=[0,1,2,3]", "debug=fast", "logger=csv",
        *SMALL_RELATIONAL, "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
        f"paths.log_dir={tmp_path}", "run_name=peg", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "peg" / "metrics.json").is_file()
    assert "peg_blocks:\n    - 0\n    - 1\n    - 2\n    - 3" in (tmp_path / "peg" / "config.yaml").read_text()

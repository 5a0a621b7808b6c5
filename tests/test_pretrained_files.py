"""Pretrained files given to timm (``pretrained_cfg_overlay=dict(file=...)``) are read with ``weights_only=True``
whatever timm's own default (False in timm 1.0.23-1.0.25), and the timm pin admits only versions that build the
models and load files safely."""

from __future__ import annotations

import functools
import inspect
import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import timm
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import models
from models import create_model

ROOT = Path(__file__).resolve().parents[1]
ZOO = "deit_tiny_patch16_224_ctx_product_50_shared_k"


class _RunsCode:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_pretrained_file_loads_into_the_zoo_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = timm.create_model(ZOO)  # 1000 classes, as the pretrained cfg: timm keeps the head
    path = tmp_path / "deit.pth"
    torch.save({"model": source.state_dict()}, path)  # the layout of DeiT / iRPE checkpoints
    loaded = timm.create_model(ZOO, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


@pytest.mark.parametrize("build", ["deit_zoo", "swin_tiny"])
def test_pickled_pretrained_file_never_runs(build: str, tmp_path: Path, monkeypatch) -> None:
    """timm 1.0.23-1.0.25 behaviour simulated: its loader defaults to weights_only=False."""
    import timm.models._builder as builder

    monkeypatch.setattr(builder, "load_state_dict", functools.partial(builder.load_state_dict, weights_only=False))
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pth"
    torch.save({"model": _RunsCode(f"touch {marker}")}, path)
    overlay = {"file": str(path)}
    with pytest.raises(Exception, match="(?i)weights.only|global"):
        if build == "deit_zoo":
            timm.create_model(ZOO, pretrained=True, pretrained_cfg_overlay=overlay)
        else:
            create_model("swin_tiny_patch4_window7_224", pretrained=True, pretrained_cfg_overlay=overlay)
    assert not marker.exists()


def test_timm_pin_admits_only_supported_versions() -> None:
    """1.0.15-1.0.22 cannot build our DeiT (no ``attn_layer`` argument); 1.0.23-1.0.25 unpickle pretrained
    files; 1.0.26-1.0.30 shrink Swin's windows to 1x1 in ``set_input_size`` (tests/test_swin.py fails)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = SpecifierSet(re.search(r'"timm([^"]+)"', pyproject).group(1))
    for bad in ("1.0.15", "1.0.22", "1.0.23", "1.0.25", "1.0.26", "1.0.30", "1.1.0"):
        assert Version(bad) not in pin, bad
    assert Version("1.0.31") in pin and Version(version("timm")) in pin
    from timm.models.vision_transformer import VisionTransformer

    assert "attn_layer" in inspect.signature(VisionTransformer.__init__).parameters
    assert inspect.signature(timm.models.load_state_dict).parameters["weights_only"].default is True
    assert models.RPEVisionTransformer  # the import registered the zoo in this timm

"""Plot a trained run's relative-position tables and attention maps as PNG files (matplotlib, Agg).

    python scripts/plot_rpe.py runs/<run>                          # tables + attention of val image 0
    python scripts/plot_rpe.py runs/<run> --ckpt last --image-index 3 --query 2,5 --layers 0,3
    python scripts/plot_rpe.py runs/<run> --plots tables --out /tmp/plots

What is drawn
-------------
* ``tables_<site>_layer<i>.png``, one per attention layer ``i`` and injection site (q, k, v) that
  holds a learned table: the table as a heatmap over the offsets of the layer's token grid, one
  subplot per table head (one with shared heads). Rows are ``drow = query_row - key_row`` and
  columns ``dcol = query_col - key_col`` (the project's convention, see `rpe.index`), from
  ``-(h-1)`` to ``h-1`` (``-(w-1)`` to ``w-1``), increasing downwards and to the right. Each cell
  shows what the pair (query, key) with that offset gets: bias mode the bias value, contextual
  mode the L2 norm over the head dim of the bucket's vector. Query-site terms use the reversed
  pair (``e_ij += T_q[b(j, i)]``, see `rpe.attention`), so a q-site heatmap shows, at offset
  ``d``, the bucket of ``-d``. The cross method's two tables (``rp_rows``, ``rp_cols``) get one
  row of subplots each, as 2-D heatmaps (constant along the axis each one ignores). Swin's own
  table (timm's ``relative_position_bias_table``) is drawn the same way, as a k-site bias table.
  Every other encoding draws what its ``describe()`` offers (a fixed or MLP bias per offset, the
  score a unit query gets from a rotation, ...); one with nothing offset-shaped (Transformer-XL:
  sinusoids projected per layer) is skipped with a note.
  The grid is the patch grid of a DeiT, the window of a Swin layer, or ``--grid H,W`` (needed for
  DETR, whose grid depends on the input image).
* ``attention_image<I>_query_<cls|R_C>.png`` (DeiT runs only): validation image ``I`` (un-normalised)
  and, per layer, the attention probabilities of the chosen query token over the ``h x w`` key grid,
  averaged over heads. Probabilities come from `rpe.RPEAttention.attention_probs` on the block
  inputs captured during a forward pass, so they include every relative term exactly as the model
  uses them. Attention to non-grid keys (class token) is left out of the heatmap and its total is
  given in the subplot title.

Bad input (missing run dir, config or checkpoint, a query outside the grid, an image index out of
range, a checkpoint that does not fit the run's model or holds NaN/inf weights, validation data that
is not on disk, ...) ends with a one-line ``error: ...`` on stderr and exit code 2.

Only the PNGs are written (atomically): the run's data is read, never generated; ``--data-root DIR``
points at existing data when the run's ``data.root`` is not there.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: never open a window, work without a display

import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from lifecycle.records import PLOTS, not_a_result, run_status  # noqa: E402
from lifecycle.run_config import backbone, run_data_root  # noqa: E402
from rpe import RelativePositionTable, RPEAttention, RPESites  # noqa: E402
from rpe.tables import offset_bucket_ids  # noqa: E402
from storage.files import RunFileError, guarded, os_error_line, plain_file_exists  # noqa: E402

PLOT_CHOICES = ("all", "tables", "attention")


class PlotError(ValueError):
    """Bad input; the message is one line naming the bad value and the valid choices."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as a `PlotError` (one line) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise PlotError(f"{message} (see --help)")


# ----------------------------------------------------------------------------- offsets -> buckets
def bucket_values(table: RelativePositionTable) -> Tensor:
    """One number per head and bucket: ``(Hs, nb)`` float; bias values, or vector norms (contextual)."""
    return table.bucket_values()


def offset_heatmap(table: RelativePositionTable, h: int, w: int) -> Tensor:
    """What a pair with offset ``(dr, dc)`` (query minus key) gets from ``table`` on an ``h x w`` grid:
    ``(Hs, 2h-1, 2w-1)``, the first panel of the table's ``describe``.
    """
    return table.describe(h, w).panels[0][1]


def swin_table_heatmap(attn: nn.Module) -> Tensor:
    """timm Swin's own bias table of a window-attention layer as ``(heads, 2h-1, 2w-1)``.

    Uses the layer's ``relative_position_index`` buffer ``(N, N)`` (query minus key, like ours), so
    no index formula is repeated here.
    """
    h, w = attn.window_size
    values = attn.relative_position_bias_table.detach().float().cpu().t()  # (heads, (2h-1)(2w-1))
    ids = attn.relative_position_index.cpu()
    return values[:, offset_bucket_ids(ids, h, w)]


# ----------------------------------------------------------------------------- collecting tables
@dataclass
class TablePlot:
    """One figure: the tables of one site of one attention layer."""

    layer: int
    path: str  # module path of the attention layer
    site: str
    description: str  # e.g. "product bias"
    grid: tuple[int, int]
    panels: list[tuple[str, Tensor]]  # (name, (Hs, 2h-1, 2w-1)); two for the cross method
    signed: bool  # bias values (diverging colours) rather than norms


def attention_layers(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """Attention modules that can hold relative terms, in module order: ``(path, module)``.

    These are the layers ``--layers`` counts: a DeiT's ``blocks.{i}.attn``, a Swin's window
    attentions (all stages in order), DETR's attentions.
    """
    return [
        (name, module)
        for name, module in net.named_modules()
        if isinstance(module, RPESites) or getattr(module, "relative_position_bias_table", None) is not None
    ]


def layer_grid(net: nn.Module, attn: nn.Module, override: tuple[int, int] | None) -> tuple[int, int] | None:
    """Token grid ``(h, w)`` of one attention layer, or None when it depends on the input."""
    if override is not None:
        return override
    if hasattr(attn, "window_size"):  # Swin: the grid of every attention call is the window
        return tuple(int(v) for v in attn.window_size)
    patch_embed = getattr(net, "patch_embed", None)
    if isinstance(attn, RPEAttention) and patch_embed is not None:
        return tuple(int(v) for v in patch_embed.grid_size)
    return None


def collect_tables(
    net: nn.Module, layers: list[int], grid_override: tuple[int, int] | None
) -> tuple[list[TablePlot], list[str]]:
    """Heatmaps of every learned table of the selected ``layers``; returns ``(plots, notes)``."""
    plots: list[TablePlot] = []
    notes: list[str] = []
    all_layers = attention_layers(net)
    for index in layers:
        path, attn = all_layers[index]
        modules = attn.rpe_modules if isinstance(attn, RPESites) else []
        swin_table = getattr(attn, "relative_position_bias_table", None) is not None
        if not swin_table and not modules:
            continue
        grid = layer_grid(net, attn, grid_override)
        if grid is None:
            notes.append(f"layer {index} ({path}): token grid depends on the input; pass --grid H,W to plot its tables")
            continue
        h, w = grid
        if swin_table:
            plots.append(TablePlot(index, path, "k", "Swin's own table (exact window offsets), bias", grid,
                                   [("", swin_table_heatmap(attn))], signed=True))
        for module in modules:
            description = module.describe(h, w)
            if not description.panels:
                what = description.note or f"{description.summary} on {description.site} has nothing to draw"
                notes.append(f"layer {index} ({path}): {what}; skipped")
                continue
            plots.append(TablePlot(index, path, description.site, description.summary, grid, description.panels,
                                   signed=description.signed))
    return plots, notes


# ----------------------------------------------------------------------------- attention
def is_deit(net: nn.Module) -> bool:
    """A DeiT/ViT with `RPEAttention` blocks and a patch grid: the models attention maps are drawn for."""
    blocks = getattr(net, "blocks", None)
    return (
        blocks is not None
        and hasattr(net, "patch_embed")
        and len(blocks) > 0
        and all(isinstance(getattr(block, "attn", None), RPEAttention) for block in blocks)
    )


def attention_probabilities(net: nn.Module, images: Tensor) -> list[Tensor]:
    """Per-block attention probabilities of a DeiT on ``images`` ``(B, 3, H, W)``: list of ``(B, H, n, n)``.

    A forward hook on each ``block.attn`` sees the block's attention input (with its mask
    arguments) and recomputes the probabilities with the layer's own `attention_probs`.
    """
    probs: list[Tensor | None] = [None] * len(net.blocks)
    handles = []

    def hook(index: int):
        def capture(module: RPEAttention, args: tuple, kwargs: dict, output: Tensor) -> None:
            x = args[0] if args else kwargs["x"]
            attn_mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
            is_causal = args[2] if len(args) > 2 else kwargs.get("is_causal", False)
            probs[index] = module.attention_probs(x, attn_mask=attn_mask, is_causal=is_causal)

        return capture

    for index, block in enumerate(net.blocks):
        handles.append(block.attn.register_forward_hook(hook(index), with_kwargs=True))
    try:
        with torch.no_grad():
            net(images)
    finally:
        for handle in handles:
            handle.remove()
    return [p for p in probs if p is not None]


# ----------------------------------------------------------------------------- drawing
def _offset_ticks(extent: int) -> tuple[list[int], list[str]]:
    """Tick positions/labels for offsets ``-(extent-1) .. extent-1`` (cell ``i`` = offset ``i - (extent-1)``)."""
    step = max(1, math.ceil((2 * extent - 1) / 9))  # at most ~9 labels stay legible
    offsets = [o for o in range(-(extent - 1), extent) if o % step == 0]
    return [o + extent - 1 for o in offsets], [str(o) for o in offsets]


def fit(title: str, fig: Figure, fontsize: float, share: float = 1.0) -> str:
    """``title`` broken into lines that fit ``share`` of ``fig``'s width (less a margin) at ``fontsize``: a title
    wider than the figure would be cut at both its edges."""
    from reports.figures import wrap_to_width

    return wrap_to_width(title, 0.92 * share * fig.get_figwidth() * fig.dpi, fontsize, fig.dpi)


def draw_table(plot: TablePlot) -> Figure:
    """One row of per-head heatmaps per panel (wrapped at 6 heads per row)."""
    heads = plot.panels[0][1].shape[0]
    ncols = min(heads, 6)
    rows_per_panel = math.ceil(heads / ncols)
    nrows = rows_per_panel * len(plot.panels)
    h, w = plot.grid
    side = 2.0 + 0.12 * max(h, w)
    fig = Figure(figsize=(max(side * ncols + 0.5, 5.0), side * nrows + 1.0), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    row_ticks, col_ticks = _offset_ticks(h), _offset_ticks(w)
    for p, (panel_name, heatmap) in enumerate(plot.panels):
        for head in range(heads):
            ax = axes[p * rows_per_panel + head // ncols][head % ncols]
            data = heatmap[head].numpy()
            if plot.signed:
                bound = float(abs(data).max()) or 1.0
                image = ax.imshow(data, cmap="RdBu_r", vmin=-bound, vmax=bound)
            else:
                image = ax.imshow(data, cmap="viridis")  # norms: colour range = data range
            fig.colorbar(image, ax=ax, shrink=0.8)
            ax.set_yticks(*row_ticks)
            ax.set_xticks(*col_ticks)
            ax.set_ylabel("Δrow = query − key")
            ax.set_xlabel("Δcol = query − key")
            head_name = "shared heads" if heads == 1 else f"head {head}"
            ax.set_title(fit(f"{panel_name}\n{head_name}" if panel_name else head_name, fig, 9, share=1 / ncols),
                         fontsize=9)
        for empty in range(heads, rows_per_panel * ncols):
            axes[p * rows_per_panel + empty // ncols][empty % ncols].set_axis_off()
    title = f"layer {plot.layer} ({plot.path}), rpe on {plot.site}, grid {h}x{w}\n{plot.description}"
    fig.suptitle(fit(title, fig, 10), fontsize=10)
    return fig


def draw_attention(
    image: Tensor, title: str, maps: list[tuple[int, Tensor, float]], query_cell: tuple[int, int] | None
) -> Figure:
    """``image`` ``(H, W, 3)`` in [0, 1], then per layer ``(index, map (h, w), non-grid mass)``."""
    ncols = min(len(maps) + 1, 5)
    nrows = math.ceil((len(maps) + 1) / ncols)
    fig = Figure(figsize=(3.2 * ncols, 3.0 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    axes[0].imshow(image.numpy(), interpolation="nearest")
    axes[0].set_title(fit(title, fig, 9, share=1 / ncols), fontsize=9)
    axes[0].set_axis_off()
    for ax, (layer, heatmap, other_mass) in zip(axes[1:], maps, strict=False):
        shown = ax.imshow(heatmap.numpy(), cmap="magma", interpolation="nearest")
        fig.colorbar(shown, ax=ax, shrink=0.8)
        if query_cell is not None:
            ax.plot(query_cell[1], query_cell[0], marker="x", color="cyan", markersize=8, mew=2)
        extra = f", non-grid keys {other_mass:.2f}" if other_mass > 0 else ""
        ax.set_title(fit(f"layer {layer}{extra}", fig, 9, share=1 / ncols), fontsize=9)
        ax.set_xlabel("key col")
        ax.set_ylabel("key row")
    for ax in axes[len(maps) + 1:]:
        ax.set_axis_off()
    where = "the class token" if query_cell is None else f"cell (row {query_cell[0]}, col {query_cell[1]}) [x]"
    fig.suptitle(fit(f"attention probabilities of query {where} over the key grid, mean over heads", fig, 10),
                 fontsize=10)
    return fig


def save_figure(fig: Figure, path: Path) -> None:
    """Render to PNG and replace ``path`` atomically (temp file in the same folder + ``os.replace``)."""
    from storage.files import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())


# ----------------------------------------------------------------------------- loading a run
def resolve_checkpoint(run_dir: Path, ckpt: str) -> Path:
    """``best`` / ``last`` -> ``run_dir/checkpoints/<name>.ckpt``; anything else is a path."""
    own = ckpt in ("best", "last")
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if own else Path(ckpt)
    # the file layer tells "missing" from "there, but a FIFO or a folder" (a RunFileError naming it); a path
    # the user gives may be a link to a checkpoint, the run's own best/last may not (it could be another run's)
    exists = plain_file_exists(path, follow_links=not own)
    with guarded(path.parent, "read"):  # a folder this user may not read: one line naming it
        found = [] if exists else sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    if not exists:
        listing = ", ".join(found) if found else "none"
        raise PlotError(
            f"--ckpt {ckpt}: checkpoint {path} does not exist; valid: best, last or a checkpoint path"
            f" (in {run_dir / 'checkpoints'}: {listing})"
        )
    return path


def _one_line(err: BaseException) -> str:
    """``err``'s root cause as every command words it (an operating-system error names its path and why, never
    Python's ``[Errno 2] ...`` text), cut at 400 characters."""
    from lifecycle.console import one_line

    text = one_line(err)
    return text if len(text) <= 400 else text[:400] + " ..."


def load_run(run_dir: Path, ckpt: str, data_root: Path | None = None) -> tuple[Any, nn.Module]:
    """``(datamodule, LightningModule)`` of a run dir with the checkpoint's weights loaded (checked to fit
    the model and to be finite); ``data_root`` replaces the run's ``data.root``.

    The run's config is checked and built by `lifecycle.run_config`: nothing named in the run dir is called,
    and the datamodule never generates data.
    """
    from data.errors import absent_folder
    from lifecycle.console import user_error_types as _user_error_types
    from lifecycle.run_config import (
        RunConfigError,
        build_data_and_model,
        check_run_identity,
        load_run_checkpoint,
        load_run_config,
        load_run_weights,
    )

    if run_dir.exists() and not run_dir.is_dir():  # e.g. <run>/metrics.json: it exists, so never "does not exist"
        raise PlotError(f"{run_dir} is a file, not a run dir; expected a train.py run dir such as runs/<name>/"
                        f" (perhaps {run_dir.parent})")
    if not run_dir.is_dir():
        raise PlotError(f"run dir {run_dir} {absent_folder(run_dir)}; expected a train.py run dir such as"
                        " runs/<name>/")
    config = run_dir / "config.yaml"
    if not plain_file_exists(config):  # a FIFO or a folder there is named as such (RunFileError), not missing
        from storage.destinations import is_archive, is_archives_folder, is_run_dir
        from storage.files import entry_exists

        if is_archive(run_dir) or is_archives_folder(run_dir):  # archived runs keep their records, not weights
            what = "an archived sweep" if is_archive(run_dir) else "a folder of archived sweeps"
            raise PlotError(f"{run_dir} is {what} (archive_runs' marker): archived runs keep no checkpoints, so"
                            " nothing there can be plotted; expected a train.py run dir with its checkpoints, such as"
                            " runs/<name>/")
        if entry_exists(run_dir / "multirun.yaml"):  # a sweep's folder: its runs are its job dirs
            jobs = sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.is_symlink() and is_run_dir(p))
            example = f", e.g. {jobs[0]}" if jobs else " (it holds none yet)"
            raise PlotError(f"{run_dir} is a sweep dir (it holds multirun.yaml), not a run dir; expected one of its"
                            f" job dirs{example}")
        raise PlotError(f"run dir {run_dir} has no config.yaml; expected a train.py run dir such as runs/<name>/")
    ckpt_path = resolve_checkpoint(run_dir, ckpt)
    try:
        run_cfg = load_run_config(config)
        checkpoint = load_run_checkpoint(ckpt_path)
        check_run_identity(run_cfg, config, checkpoint, ckpt_path)
    except RunConfigError as err:
        raise PlotError(str(err)) from None
    try:
        datamodule, module = build_data_and_model(run_cfg, data_root=data_root)
    except _user_error_types() as err:
        raise PlotError(f"cannot build the model of {config}: {_one_line(err)}") from None
    try:
        load_run_weights(module, checkpoint, ckpt_path, config)
    except RunConfigError as err:
        raise PlotError(str(err)) from None
    return datamodule, module


def validation_image(
    datamodule: Any, index: int, source: str = "the run's config"
) -> tuple[Tensor, Tensor, str]:
    """``(normalised (3, H, W), displayable (H, W, 3) in [0, 1], label name)`` of validation image ``index``.

    The data must be on disk (`lifecycle.run_config.require_existing_data`); ``source`` names the config
    that names it.
    """
    from lifecycle.run_config import require_existing_data

    try:
        require_existing_data(datamodule, source, "--data-root DIR")
        datamodule.setup("validate")
    except (ValueError, FileNotFoundError) as err:
        raise PlotError(f"cannot load the run's validation data: {_one_line(err)}") from None
    dataset = getattr(datamodule, "val_set", None)
    if dataset is None:
        raise PlotError(f"the run's data module {type(datamodule).__name__} has no val_set")
    if not 0 <= index < len(dataset):
        raise PlotError(
            f"--image-index {index} is out of range; the validation set has {len(dataset)} images"
            f" (valid: 0..{len(dataset) - 1})"
        )
    image, label = dataset[index]
    mean = torch.tensor(datamodule.mean).view(3, 1, 1)
    std = torch.tensor(datamodule.std).view(3, 1, 1)
    shown = (image * std + mean).clamp(0, 1).permute(1, 2, 0)
    classes = getattr(dataset, "classes", None)
    label_name = classes[label] if classes is not None else str(label)
    return image, shown, label_name


# ----------------------------------------------------------------------------- argument parsing
MAX_GRID = 64  # token rows or columns of a plotted grid (224 px at patch 4 is 56)


def _pair(text: str, option: str) -> tuple[int, int]:
    try:
        first, second = (int(v) for v in text.split(","))
    except ValueError:
        raise PlotError(f"{option} {text!r} must be two comma-separated integers such as 2,5") from None
    return first, second


def parse_layers(text: str, count: int) -> list[int]:
    """``all`` or ``0,2,...`` -> sorted layer indices, each in ``0..count-1``."""
    valid = f"valid: all or comma-separated indices in 0..{count - 1}" if count else "the model has no attention layers"
    if text == "all":
        return list(range(count))
    try:
        layers = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise PlotError(f"--layers {text!r} is not a list of layer indices; {valid}") from None
    bad = [layer for layer in layers if not 0 <= layer < count]
    if bad:
        raise PlotError(
            f"--layers {text}: layer {bad[0]} does not exist, the model has {count} attention layers; {valid}"
        )
    return layers


def parse_query(text: str | None, h: int, w: int, has_cls: bool) -> tuple[str, tuple[int, int] | None]:
    """``(name for file names, grid cell or None for the class token)``; default: cls if any, else the centre."""
    valid = f"valid: {'cls or ' if has_cls else ''}R,C with 0 <= R < {h}, 0 <= C < {w}"
    if text is None:
        text = "cls" if has_cls else f"{h // 2},{w // 2}"
    if text == "cls":
        if not has_cls:
            raise PlotError(f"--query cls: the model has no class token; {valid}")
        return "cls", None
    try:
        r, c = _pair(text, "--query")
    except PlotError:
        raise PlotError(f"--query {text!r} is neither cls nor R,C; {valid}") from None
    if not (0 <= r < h and 0 <= c < w):
        raise PlotError(f"--query {text} is outside the {h}x{w} token grid; {valid}")
    return f"{r}_{c}", (r, c)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plot_rpe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a train.py run dir (holds config.yaml and checkpoints/)")
    parser.add_argument("--ckpt", default="best", help="best, last or a checkpoint path (default: best)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_DIR/plots)")
    parser.add_argument("--image-index", type=int, default=0, help="validation image for attention maps")
    parser.add_argument("--query", default=None, help="cls or R,C (grid cell); default cls, else the centre")
    parser.add_argument("--layers", default="all", help="all or comma-separated attention-layer indices")
    parser.add_argument("--plots", default="all", help=f"one of: {', '.join(PLOT_CHOICES)}")
    parser.add_argument("--grid", default=None, help="H,W token grid for the tables (default: the model's)")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="existing data to draw validation images from instead of the run's data.root")
    return parser


# ----------------------------------------------------------------------------- main
def plot_run(args: argparse.Namespace, written: list[Path] | None = None) -> list[Path]:
    """Write the requested PNGs; returns their paths (``written``, where given: each path is added once its
    file is whole, so that an interruption can say which are)."""
    if args.plots not in PLOT_CHOICES:
        raise PlotError(f"--plots {args.plots!r} is not one of: {', '.join(PLOT_CHOICES)}")
    grid_override = None
    if args.grid is not None:
        grid_override = _pair(args.grid, "--grid")
        if min(grid_override) < 1 or max(grid_override) > MAX_GRID:
            # the tables are drawn over all (H W)^2 offset pairs: a huge grid would exhaust memory
            raise PlotError(f"--grid {args.grid} is out of range; valid: H,W with 1 <= H, W <= {MAX_GRID}")
    run_dir: Path = args.run_dir
    out_path = args.out if args.out is not None else run_dir / PLOTS
    if out_path.exists() and not out_path.is_dir():  # found before the run is loaded, not at the first save
        raise PlotError(f"--out {out_path} is a file, not a folder; valid: a folder (made if missing)")
    if args.out is not None:  # the default, <run dir>/plots, is the run's own folder of plots
        from storage.destinations import DestinationError, check_destination

        try:
            check_destination(out_path, "--out", data_roots=[args.data_root, run_data_root(run_dir)])
        except DestinationError as err:
            raise PlotError(str(err)) from None
    else:
        from storage.files import own_folder_problem

        problem = own_folder_problem(out_path, "plots")  # a link there would take the PNGs into its target
        if problem:
            raise PlotError(f"{out_path}: {problem} (nothing was drawn)")
    datamodule, module = load_run(run_dir, args.ckpt, args.data_root)
    net = backbone(module).eval()
    layers_all = attention_layers(net)
    layers = parse_layers(args.layers, len(layers_all))
    out_dir: Path = args.out if args.out is not None else run_dir / PLOTS
    written = [] if written is None else written

    want_attention = args.plots in ("all", "attention")
    attention_ok = is_deit(net)
    if want_attention and not attention_ok and args.plots == "attention":
        raise PlotError(
            f"--plots attention: attention maps are drawn for DeiT models only, this run's net is"
            f" {type(net).__name__}; valid: --plots tables"
        )

    # Validate the query and image before any (slow) drawing, so bad input fails fast.
    query = None
    if want_attention and attention_ok:
        h, w = (int(v) for v in net.patch_embed.grid_size)
        has_cls = getattr(net, "cls_token", None) is not None
        query = parse_query(args.query, h, w, has_cls)
        source = "--data-root" if args.data_root is not None else str(run_dir / "config.yaml")
        images, shown, label = validation_image(datamodule, args.image_index, source)

    if args.plots in ("all", "tables"):
        plots, notes = collect_tables(net, layers, grid_override)
        for note in notes:
            print(f"note: {note}")
        if not plots:
            preset = getattr(getattr(net, "rpe_config", None), "method", None)
            reason = f" (rpe method: {preset})" if preset else ""
            if any("pass --grid H,W" in note for note in notes):  # tables there are, for a grid the user names
                reason += "; its tables depend on the input's token grid: pass --grid H,W to draw them"
            if args.plots == "tables":
                raise PlotError(
                    f"the run's model has no plottable relative position tables{reason}; nothing to draw for"
                    " --plots tables; valid: --plots attention or all"
                )
            if query is None:  # not a DeiT either: there would be nothing at all to draw
                raise PlotError(
                    f"the run's model has no plottable relative position tables{reason} and attention maps are"
                    f" drawn for DeiT models only ({type(net).__name__}); nothing to plot"
                )
            print(f"note: the run's model has no relative position tables{reason}; drawing attention maps only")
        for plot in plots:
            path = out_dir / f"tables_{plot.site}_layer{plot.layer}.png"
            save_figure(draw_table(plot), path)
            written.append(path)
    if want_attention and not attention_ok:
        print(f"note: attention maps are drawn for DeiT models only ({type(net).__name__}); skipped")

    if query is not None:
        query_name, cell = query
        probs = attention_probabilities(net, images.unsqueeze(0))
        n = probs[0].shape[-1]
        skip = n - h * w
        row = 0 if cell is None else skip + cell[0] * w + cell[1]  # the class token is token 0 in timm
        maps = []
        for layer in layers:
            attention = probs[layer][0, :, row].mean(0)  # (n,) over keys, mean over heads
            maps.append((layer, attention[skip:].view(h, w), float(attention[:skip].sum())))
        figure = draw_attention(shown, f"val image {args.image_index}, label {label}", maps, cell)
        path = out_dir / f"attention_image{args.image_index}_query_{query_name}.png"
        save_figure(figure, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; returns the exit code (2 with a one-line ``error:`` on bad input; 128 + the signal's
    number with one line naming the plots written whole, when a stop signal or Ctrl-C ends it)."""
    from lifecycle.signals import exit_when_interrupted

    written: list[Path] = []

    def outcome() -> str:
        if not written:
            return "no plot was written (each is written whole or not at all)"
        plots = "the plot written is" if len(written) == 1 else f"the {len(written)} plots written are"
        return (f"{plots} whole ({', '.join(str(p) for p in written)}), no other was written: run the same command"
                " again for all")

    with exit_when_interrupted("plot_rpe.py", outcome):
        return _plotted(argv, written)


def _plotted(argv: list[str] | None, written: list[Path]) -> int:
    """`main`'s work: the plots, each path printed once all are written; 2 with one line on bad input."""
    try:
        args = build_parser().parse_args(argv)  # its bad arguments are a PlotError, one line
        plot_run(args, written)
    except (PlotError, RunFileError) as err:  # RunFileError: the plots cannot be written (full disk, read-only)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the storage's answer elsewhere (a folder this user may not read): it names the path
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    run_dir = Path(args.run_dir)
    why = not_a_result(run_dir, run_status(run_dir), "plots") if (run_dir / "run.json").exists() else ""
    if why:  # drawn all the same: a run in progress may be looked at, but it is no result yet
        print(f"note: not a result: {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())

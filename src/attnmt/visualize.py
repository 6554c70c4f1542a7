"""Pictures of a model: attention heatmaps, training curves and positional encodings, drawn with
matplotlib.

Figures are made with ``matplotlib.figure.Figure`` and the Agg canvas directly, never through
``pyplot``, so importing or calling this module changes no global matplotlib state and needs
no display. Subword labels are drawn with DejaVu Sans (bundled with matplotlib), which covers
Latin, Greek and Cyrillic text.

Shapes: H heads, T output length, S source length, P positions, D d_model.

Library: matplotlib.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from attnmt.errors import DataError, OptionError
from attnmt.model.positional import sinusoidal_table
from attnmt.atomic import atomic_write
from attnmt.rundir import load_model_dir, read_config
from attnmt.train.metrics import read_log


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _heatmap(ax, weights: torch.Tensor, x_labels: list[str], y_labels: list[str], title: str, fontsize: float):
    image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(x_labels)))
    ax.set_xticklabels(x_labels, rotation=60, ha="right", fontsize=fontsize)
    ax.set_yticks(range(len(y_labels)))
    ax.set_yticklabels(y_labels, fontsize=fontsize)
    ax.set_title(title, fontsize=fontsize + 2)
    return image


def plot_attention(weights: torch.Tensor, x_labels: list[str], y_labels: list[str], path: str | Path,
                   title: str, x_name: str = "source", y_name: str = "output") -> None:
    """Draw one layer's attention: the head average large, then each head in a grid.

    Args:
        weights: (H, T, S) float attention of one layer; row t sums to 1 over the S keys.
        x_labels: S key labels (source subwords); y_labels: T query labels (output subwords).
        path: PNG file to write.
        title: figure title (the sentence and the layer).
    Raises:
        ValueError: label counts that do not match the weights.
    """
    heads, rows, cols = weights.shape
    if len(x_labels) != cols or len(y_labels) != rows:
        raise ValueError(f"weights are {rows}x{cols} but there are {len(y_labels)}x{len(x_labels)} labels")
    weights = weights.float().cpu()
    grid_cols = min(4, heads)
    grid_rows = math.ceil(heads / grid_cols)
    cell = max(0.28, min(0.45, 9.0 / max(rows, cols)))
    panel_w, panel_h = max(3.0, cols * cell * 0.55), max(2.6, rows * cell * 0.55)
    avg_w, avg_h = max(5.0, cols * cell + 2.0), max(4.0, rows * cell + 1.5)
    width = max(avg_w, grid_cols * panel_w) + 1.5
    height = avg_h + grid_rows * panel_h + 1.5
    fig = _figure(width, height)
    outer = fig.add_gridspec(2, 1, height_ratios=[avg_h, grid_rows * panel_h], hspace=0.35)
    ax = fig.add_subplot(outer[0])
    image = _heatmap(ax, weights.mean(dim=0), x_labels, y_labels, "average of heads", 9)
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="attention weight")
    inner = outer[1].subgridspec(grid_rows, grid_cols, hspace=0.9, wspace=0.5)
    for h in range(heads):
        _heatmap(fig.add_subplot(inner[h // grid_cols, h % grid_cols]), weights[h], x_labels, y_labels,
                 f"head {h + 1}", 6)
    fig.suptitle(title, fontsize=11)
    save_figure(fig, path)


def read_training_log(run_dir: str | Path) -> list[dict]:
    """The records of a run's ``train_log.jsonl`` (a torn last line skipped, see
    ``attnmt.train.metrics.read_log``).

    Raises:
        DataError: the log is unreadable or holds a line that is not a JSON record.
    """
    return read_log(Path(run_dir) / "train_log.jsonl")


def save_figure(fig, path: str | Path) -> None:
    """Write a figure as PNG, atomically (``attnmt.atomic.atomic_write``; WriteError if it cannot)."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", bbox_inches="tight"))


def _finite(value: object) -> bool:
    """Whether a logged value can be drawn: a finite number, not a boolean (an early validation's
    perplexity may be inf; a hand-edited log may hold anything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot_training(run_dir: str | Path, path: str | Path) -> None:
    """Draw training loss, learning rate, validation perplexity and BLEU against updates.

    Raises:
        DataError: an unreadable ``train_log.jsonl``, or one without a training or validation
            record. WriteError: ``path`` cannot be written.
    """
    records = read_training_log(run_dir)
    train = [r for r in records if r.get("kind") == "train" and isinstance(r.get("step"), (int, float))]
    valid = [r for r in records if r.get("kind") == "valid" and isinstance(r.get("step"), (int, float))
             and r.get("valid_ppl") is not None]
    if not train and not valid:  # an empty log: a picture of nothing would hide it
        raise DataError(f"{Path(run_dir) / 'train_log.jsonl'}: no training or validation record to draw (empty, or "
                        "not attnmt's log?)")
    fig = _figure(11, 7)
    panels = [
        ("training loss (label-smoothed, per token)", train, "loss"),
        ("learning rate", train, "lr"),
        ("validation perplexity", valid, "valid_ppl"),
        ("validation BLEU (greedy)", valid, "valid_bleu"),
    ]
    for i, (title, rows, key) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        points = [(r["step"], r[key]) for r in rows if _finite(r["step"]) and _finite(r.get(key))]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if rows is valid else None,
                    markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    fig.suptitle(f"training of {Path(run_dir).name}", fontsize=12)
    fig.tight_layout()
    save_figure(fig, path)


def positional_tables(run_dir: str | Path, max_len: int) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """The positional encodings of a model directory for positions 0 .. max_len - 1, and a title.

    Sinusoidal positions: the one (P, D) table of section 3.5 in the model's ``positional_layout``
    (times each side's ``positional_scale`` where the model learned one). Learned positions: the
    encoder's and the decoder's trained (P, D) tables.

    Raises:
        CheckpointError, ConfigError: not a readable model directory.
        ValueError: ``max_len`` beyond the model's ``max_positions``.
    """
    config = read_config(run_dir)
    mc = config.model
    if max_len > mc.max_positions:
        raise OptionError(f"--max-len {max_len} exceeds the model's max_positions {mc.max_positions}")
    name = Path(run_dir).name
    if mc.positional == "sinusoidal" and not mc.positional_scale:
        table = sinusoidal_table(max_len, mc.d_model, mc.positional_layout)
        return [(f"sinusoidal, {mc.positional_layout} layout", table)], f"positional encodings of {name}"
    _, _, _, model = load_model_dir(run_dir)
    tables = []
    with torch.no_grad():
        for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
            table = stack.positions(max_len)[0].float()  # (P, D)
            if stack.position_scale is not None:
                table = table * stack.position_scale
            tables.append((f"{side}, {mc.positional}", table))
    return tables, f"positional encodings of {name}"


def plot_positions(tables: list[tuple[str, torch.Tensor]], path: str | Path, title: str,
                   dims: tuple[int, ...] = (6, 7, 8, 9)) -> None:
    """Draw positional encodings: each table as a heatmap (position x dimension), and below it a
    few of its dimensions as curves over the positions (as the d2l / GluonNLP write-up of
    section 3.5 shows them: sinusoids whose wavelength grows with the dimension).

    Args:
        tables: (name, (P, D) float tensor) pairs, drawn side by side.
        path: PNG file to write.
        title: figure title.
        dims: the dimensions drawn as curves (those below D).
    Raises:
        WriteError: ``path`` cannot be written.
    """
    fig = _figure(6.5 * len(tables), 8)
    for col, (name, table) in enumerate(tables):
        table = table.detach().float().cpu()
        positions, d_model = table.shape
        ax = fig.add_subplot(2, len(tables), col + 1)
        image = ax.imshow(table.numpy(), cmap="RdBu_r", aspect="auto", interpolation="nearest",
                          vmin=-float(table.abs().max()), vmax=float(table.abs().max()))
        ax.set_xlabel("encoding dimension")
        ax.set_ylabel("position")
        ax.set_title(f"{name} ({positions} x {d_model})", fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        ax = fig.add_subplot(2, len(tables), len(tables) + col + 1)
        for d in (d for d in dims if d < d_model):
            ax.plot(range(positions), table[:, d].numpy(), label=f"dimension {d}")
        ax.set_xlabel("position")
        ax.set_ylabel("value")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    save_figure(fig, path)

"""Draw a layout to a PNG, heads side by side."""

from __future__ import annotations

import os

import torch


def plot_layout(layout: torch.Tensor, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Write `layout` ((num_heads, nb, nb) or (nb, nb)) as a PNG: one panel per head, present blocks dark.

    Needs matplotlib: `pip install "ds-sparse-attn[plot]"`.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            'plot_layout needs matplotlib: pip install "ds-sparse-attn[plot]" (or pip install matplotlib)'
        ) from exc
    if layout.dim() == 2:
        layout = layout.unsqueeze(0)
    if layout.dim() != 3:
        raise ValueError(f"layout must be (num_heads, nb, nb) or (nb, nb), got shape {tuple(layout.shape)}.")
    num_heads, num_blocks = layout.shape[0], layout.shape[1]
    fig, axes = plt.subplots(1, num_heads, figsize=(2.5 * num_heads, 2.8), squeeze=False)
    for h, ax in enumerate(axes[0]):
        ax.imshow(layout[h].detach().cpu().numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        density = float(layout[h].float().mean())
        ax.set_title(f"head {h} ({density:.0%})", fontsize=9)
        ax.set_xlabel("key block")
        if h == 0:
            ax.set_ylabel("query block")
        ax.set_xticks([0, num_blocks - 1])
        ax.set_yticks([0, num_blocks - 1])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)

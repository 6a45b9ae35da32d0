"""Loss and held-out acceptance curves of a drafter training run, as PNG files.

python -m ops.training.plots .cache/train-mtp docs/drafters mtp
python -m ops.training.plots .cache/train-dflash docs/drafters dflash
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot_history(run_dir: Path, out_dir: Path, name: str = "mtp") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = json.loads((run_dir / "history.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_path, accept_path = out_dir / f"{name}-loss.png", out_dir / f"{name}-acceptance.png"
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(range(1, len(history["losses"]) + 1), history["losses"])
    label = "weighted chain loss (3 steps)" if name == "mtp" else "weighted block loss (7 rows)"
    axes.set(xlabel="update", ylabel=label, title=f"{name}: training loss")
    figure.tight_layout()
    figure.savefig(loss_path, dpi=100)
    figure, axes = plt.subplots(figsize=(6, 3.5))
    updates, values = zip(*history["evals"]) if history["evals"] else ((), ())
    axes.plot(updates, values, marker="o")
    axes.set(xlabel="update", ylabel="tokens per target forward", title=f"{name}: held-out tokens per target forward")
    figure.tight_layout()
    figure.savefig(accept_path, dpi=100)
    plt.close("all")
    return [loss_path, accept_path]


if __name__ == "__main__":
    for path in plot_history(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4]):
        print(f"wrote {path}")

"""Metrics sinks: wandb, TensorBoard and a JSON-lines file in the run directory.

This is the one module that imports wandb. Keys are grouped like CleanRL's: `charts/`
(throughput, games), `losses/` (PPO statistics), `league/` (ratings, lag, queue, restarts).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ludus.errors import UserError


class MetricsLogger:
    """Writes scalar metrics to every configured sink; `close()` flushes them."""

    def __init__(self, run_dir: str | os.PathLike, wandb_mode: str = "disabled", wandb_project: str = "ludus",
                 tensorboard: bool = False, run_name: str | None = None, config: dict | None = None,
                 resume: bool = False):
        self.run_dir = Path(run_dir)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self.tb = None
        self.wandb_run = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        mode = os.environ.get("WANDB_MODE", wandb_mode)
        if mode != "disabled":
            self.wandb_run = self._start_wandb(mode, wandb_project, run_name, config, resume)

    def _start_wandb(self, mode: str, project: str, run_name: str | None, config: dict | None, resume: bool):
        import wandb

        if mode == "online" and not os.environ.get("WANDB_API_KEY"):
            # With no key, wandb raises deep inside init; say what to do instead.
            mode = "offline"
        try:
            return wandb.init(project=project, name=run_name, dir=str(self.run_dir), mode=mode, config=config,
                              id=run_name, resume="allow" if resume else None, reinit="finish_previous")
        except wandb.errors.UsageError as exc:
            raise UserError(f"wandb could not start ({exc}); set --set log.wandb=disabled or WANDB_MODE=offline") \
                from None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record: dict[str, Any] = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()

"""zoo-eval: the test (or validation) metrics of a checkpoint, on the data it was trained on; or of a
pretrained model (an HF folder, a GGUF file) on the data ``+data=<name>`` names."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import RichProgressBar
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from tasks.cli.boundary import user_errors
from tasks.cli.console import quiet_libraries
from tasks.cli.loading import data_module, for_inference
from tasks.cli.pretrained import load_model_task
from tasks.cli.values import check_values
from tasks.errors import UserError
from zoo.io import atomic_write_text


@user_errors
def run(cfg: DictConfig) -> dict[str, float]:
    """zoo-eval on the config Hydra composed (tasks.cli.verbs.evaluate)."""
    if cfg.split not in ("test", "val"):
        raise UserError(f"split={cfg.split!r} must be 'test' or 'val'")
    check_values(cfg)  # data.* overrides (+data.batch_size=0 …)
    quiet_libraries()
    task, info = load_model_task(cfg.ckpt_path)
    for_inference(task, cfg)  # quantize= / kv_cache=: the metrics of the model in those precisions
    datamodule = data_module(info, task, **OmegaConf.to_container(cfg.data, resolve=True))
    trainer = instantiate(cfg.trainer, callbacks=[RichProgressBar()], enable_checkpointing=False)
    run = trainer.test if cfg.split == "test" else trainer.validate
    metrics = {k: float(v) for k, v in run(task, datamodule=datamodule, verbose=False)[0].items()}
    out = Path(HydraConfig.get().runtime.output_dir)
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2))
    table = Table(title=f"zoo-eval ({cfg.split} split)", show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # a long checkpoint path is folded, never cut
    table.add_row("checkpoint", str(cfg.ckpt_path))
    for key in ("quantize", "kv_cache"):
        if cfg.get(key) is not None:
            table.add_row(key, str(cfg[key]))
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{value:.4f}")
    Console().print(table)
    print(f"metrics written to {out / 'metrics.json'}")
    return metrics

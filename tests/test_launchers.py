"""hydra/launcher=slurm composes with zoo's config (no sbatch needed) and keeps the SLURM allocation
and the trainer together; hydra/launcher=local (submitit) runs a real grid, which zoo-sweep-report reads."""

from __future__ import annotations

import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from tasks.cli.schemas import conf_dir

TINY = [
    "experiment=gpt_generator",
    "data.source_args.max_files=40",
    "data.vocab_size=300",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "test=false",
    "task.sample_tokens=4",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput=null",
]


def test_slurm_launcher_follows_the_trainer():
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "hydra/launcher=slurm",
                "trainer=ddp",
                "trainer.devices=4",
                "trainer.num_nodes=2",
                "hydra.launcher.partition=gpu",
                "experiment=bert_mlm",
            ],
            return_hydra_config=True,
        )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (2, 4, 4)
    assert launcher["partition"] == "gpu" and launcher["name"] == "bert_mlm"
    assert launcher["submitit_folder"].startswith("outputs/bert_mlm/multiruns/")  # beside the jobs (hydra: default)


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_grid_the_report_reads(tmp_path, capsys, monkeypatch):
    """zoo-train -m in this process (the sweep); submitit starts each job in a process of its own."""
    from tasks.cli import verbs

    sweep = tmp_path / "sweep"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        ["zoo-train", "-m", "hydra/launcher=local", *TINY, "model/position=rope,alibi", f"hydra.sweep.dir={sweep}"],
    )
    verbs.train()
    results = list((sweep / ".submitit").glob("*/*_result.pkl"))
    assert len(results) == 2  # each job ran as a submitit job, in its own process
    for job, position in (("0", "rope"), ("1", "alibi")):
        assert f"position: {position}" in (sweep / job / "config.yaml").read_text()
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
    capsys.readouterr()

    sweep_report.main([str(sweep)])
    table = (sweep / "sweep_report.md").read_text()
    assert table in capsys.readouterr().out
    assert "grid multirun, 2 jobs" in table and "| model/position |" in table
    assert "| COMPLETE |" in table and "rope" in table and "alibi" in table
    assert "`model.d_model=32`" in table  # the overrides every job had, listed once
    assert (sweep / "sweep_model_position.png").stat().st_size > 5000

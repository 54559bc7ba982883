"""The GPU configuration, proven on the CPU (CI has no GPU): gradient clipping with fused optimizers under
mixed precision (tasks.run.precision.clip_under_mixed_precision), every experiment on ``trainer=gpu`` with
``trainer.accelerator=cpu optimizer.fused=true``, every trainer file composed as its GPU use has it, and a
failure while fitting ending the verb in one line with its traceback kept in the run directory."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from test_tasks import TINY, compose_train
from torch.utils.data import DataLoader

import zoo
from tasks import GeneratorTask
from tasks.cli.boundary import user_errors
from tasks.cli.train.training import keep_traceback, train
from tasks.errors import RunFailed
from tasks.optim import build_optimizer

ADAMW = {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8}
MUON = {**ADAMW, "name": "muon"}
CLIP = {"norm": 1e-3, "value": 1e-5}  # small enough that every step clips
VOCAB, B, T = 61, 4, 16
SCHEDULE = {"warmup_steps": 0, "min_lr_ratio": 1.0}


def _task(optimizer: dict, fused: bool) -> GeneratorTask:
    cfg = zoo.get_config("gpt-tiny", vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=2, max_seq_len=T)  # 128 rows
    torch.manual_seed(0)
    return GeneratorTask(model=cfg.to_dict(), optimizer={**optimizer, "fused": fused}, scheduler=SCHEDULE)


def _batches(n: int = 3) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (n, B, T + 1), generator=generator)
    return [{"input_ids": x[:, :-1], "labels": x[:, 1:]} for x in ids]


def _fit(task: GeneratorTask, precision: str, algorithm: str | None) -> None:
    """Two steps on the CPU under ``precision`` (16-mixed through its plugin: Lightning's flag turns it
    into bf16-mixed on a CPU), clipping every step by ``algorithm`` (None: not at all). Two, because from
    the third on fp16's rounding of the activations turns the fused and unfused kernels' last-bit
    differences into ones that a tolerance can no longer tell from a wrong step."""
    plugin = {"plugins": [MixedPrecision("16-mixed", "cpu")]} if precision == "16-mixed" else {"precision": precision}
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        gradient_clip_val=CLIP.get(algorithm),
        gradient_clip_algorithm=algorithm,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        **plugin,
    )
    trainer.fit(task, train_dataloaders=DataLoader(_batches(), batch_size=None))


@pytest.mark.parametrize("optimizer", [ADAMW, MUON], ids=["adamw", "muon"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fused_optimizers_clip_under_mixed_precision_as_unfused_ones_do(precision, algorithm, optimizer):
    """Lightning refuses to clip for an optimizer that unscales inside its step (fused AdamW, Muon's AdamW
    half): zoo clips it (fp16: after unscaling), and the weights are those of the unfused optimizer, whose
    clipping is Lightning's own. The gradients the last step read were clipped."""
    fused, plain = _task(optimizer, fused=True), _task(optimizer, fused=False)
    for task in (fused, plain):
        _fit(task, precision, algorithm)
    adamw = build_optimizer(fused, fused.optimizer_settings)
    assert getattr(adamw, "adamw", adamw).defaults["fused"]  # the run really had fused kernels
    grads = [p.grad for p in fused.parameters() if p.grad is not None]
    assert grads
    if algorithm == "norm":
        assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= CLIP["norm"] * 1.01
    else:
        assert max(g.abs().max() for g in grads) <= CLIP["value"]
    tolerance = 5e-4 if optimizer is MUON else 1e-4
    for (name, a), b in zip(fused.named_parameters(), plain.parameters(), strict=True):
        # atol 1e-4: the fused kernel rounds fp16's unscaling in another order, and Adam divides by the root
        # of a second moment that is tiny where a gradient is near zero (3.4e-5 apart seen on an AMD EPYC
        # CPU); each step moves a weight by about lr = 1e-2. The clipping itself is checked on the grads.
        # Muon: 5e-4. The fused and unfused AdamW halves part in the last bits after one step, so the second
        # step's gradients do too, and torch's Muon orthogonalizes them in bfloat16 (Newton-Schulz, 8-bit
        # mantissa): a last-bit difference flips a bf16 rounding, which the next gradients carry to every
        # weight. Measured 2026-12-06 (CPU, these 2 steps, padded to 128 rows or not): up to 1.26e-4 apart,
        # the weight and setting by chance (unpadded, bf16-mixed unclipped: an attention bias; padded,
        # bf16-mixed clipped by norm: blocks.0.attn.out); at most 5e-6 with Newton-Schulz run in float32.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=tolerance, msg=name)


def test_clipping_changes_the_steps_it_is_asked_to():
    """The check above can fail: with the clip removed the weights differ from the clipped run's."""
    clipped, free = _task(ADAMW, fused=True), _task(ADAMW, fused=True)
    _fit(clipped, "bf16-mixed", "value")
    _fit(free, "bf16-mixed", None)
    assert not all(torch.equal(a, b) for a, b in zip(clipped.parameters(), free.parameters(), strict=True))


GPU_ON_CPU = ["trainer=gpu", "trainer.accelerator=cpu", "optimizer.fused=true"]


@pytest.mark.parametrize("experiment", list(TINY))
def test_each_experiment_trains_with_the_gpu_trainer_on_the_cpu(experiment, tmp_path):
    """What a GPU user runs (bf16-mixed, fused AdamW, clipping), a few steps on the CPU."""
    cfg = compose_train(experiment, tmp_path, *GPU_ON_CPU, "test=false", "trainer.max_steps=3")
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.gradient_clip_val > 0
    metric = train(cfg)
    assert metric is not None and metric == metric  # not NaN
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


def test_a_failure_while_fitting_is_one_line_and_its_traceback_is_kept(tmp_path, monkeypatch, capsys):
    def broken(self, batch, batch_idx, stage):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(GeneratorTask, "model_step", broken)
    cfg = compose_train("gpt_generator", tmp_path, "test=false")
    with pytest.raises(RunFailed) as caught:
        train(copy.deepcopy(cfg))
    assert caught.value.kind == "RuntimeError" and str(tmp_path / "error.log") in str(caught.value)
    log = (tmp_path / "error.log").read_text()
    assert "Traceback" in log and "illegal memory access" in log and "more lines" in log

    with pytest.raises(SystemExit) as ended:  # the verb: one line, exit 1
        user_errors(train)(compose_train("gpt_generator", tmp_path / "again", "test=false"))
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("zoo:")]
    assert ended.value.code == 1 and len(err) == 1 and "Traceback" not in stderr, stderr
    assert err[0].startswith("zoo: RuntimeError: CUDA error: an illegal memory access was encountered (the full")
    assert err[0].endswith(f"{tmp_path / 'again' / 'error.log'})")


def test_a_kept_traceback_overwrites_no_earlier_one(tmp_path):
    (tmp_path / "error.log").write_text("an earlier attempt's")
    assert keep_traceback(tmp_path, ValueError("now")) == str(tmp_path / "error_2.log")
    assert (tmp_path / "error.log").read_text() == "an earlier attempt's"
    assert "ValueError: now" in (tmp_path / "error_2.log").read_text()
    assert keep_traceback(tmp_path / "missing", ValueError("now")) is None


def test_the_closing_table_gives_the_pace_and_mfu_that_the_gpu_check_reads(capsys, monkeypatch):
    """zoo-train's closing table holds the fit's pace (validation included) and the MFU, on one line each at
    80 columns, where scripts/gpu_summary.py finds them."""
    import importlib.util
    from pathlib import Path

    from conftest import tiny_config

    from tasks.cli.train.training import summarize

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_summary.py"
    spec = importlib.util.spec_from_file_location("gpu_summary", path)
    gpu_summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_summary)
    monkeypatch.setenv("COLUMNS", "80")
    metrics = {"val/chrf": 0.5, "perf/tokens_per_s": 123456.0, "perf/mfu": 0.4321}
    summarize(Path("/runs/x"), "", metrics, tiny_config(), 1234, ("val/chrf", 0.5), (1000, 90.31))
    out = capsys.readouterr().out
    pace = gpu_summary.PACE.search(out)
    assert pace and (pace[1], pace[2], pace[3]) == ("1,000", "90.3", "11.07"), out
    assert "43.2% of the devices' peak" in out


@pytest.mark.slow
def test_compile_true_trains_the_losses_of_the_eager_run(tmp_path):
    """zoo-train compile=true (the model's forward and the training loss compiled whole, inductor on the CPU)
    trains the eager run's losses, and its checkpoint keeps the plain model's names."""
    import csv

    losses = {}
    for compile in ("false", "true"):
        out = tmp_path / compile
        train(compose_train("gpt_generator", out, f"compile={compile}", "test=false", "trainer.max_steps=4"))
        with (out / "logs" / "metrics.csv").open() as f:
            losses[compile] = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(losses["true"]) == 4
    torch.testing.assert_close(losses["true"], losses["false"], rtol=1e-4, atol=1e-4)
    state = torch.load(tmp_path / "true" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert not any("_orig_mod" in name for name in state)

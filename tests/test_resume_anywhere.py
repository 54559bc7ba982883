"""Exact resume wherever the interrupt lands (issue 44): a run interrupted at each phase of a step — in the
loader's fetch, before the forward, inside the backward, between the optimizer's update and Lightning's
counts, after the step is counted, at an epoch's end and the next one's start, inside the validation, inside a
checkpoint save, while a resumed run is set up — by Ctrl-C (a raised KeyboardInterrupt or a real SIGINT),
SIGTERM or kill -9, then resumed with ``zoo-train resume=<run dir>``, ends with the metrics.csv of a run that
never stopped: the same rows and columns, every loss equal to the bit (timing values excepted), dropout on.

The interrupt is a test-only callback (tests/fault_injection.py) added to the trainer, not to the config: the
resumed run is zoo's own config, which ``resume=`` reads from the checkpoint.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_injection import Fault, injected
from omegaconf import OmegaConf
from test_tasks import compose_train

from tasks.cli.resuming import resumed_config
from tasks.cli.train.training import train

TESTS = Path(__file__).parent
# 8 steps, epochs of 5 batches (step 6 starts the second), validation after steps 4 and 8, dropout drawing
RUN = [
    "test=false",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "++trainer.limit_train_batches=5",
    "model.dropout=0.1",
    "callbacks.throughput.window=3",
]
SETUPS = {  # name: (experiment, settings)
    "generator": ("gpt_generator", []),
    "translator": ("t5_translator", []),
    "packing": ("gpt_generator", ["data.packing=documents", "model/mask=document"]),
    "accumulation": (  # windows of 2 batches, epochs of 3 steps, a validation every 2 steps (4 batches: Lightning
        "gpt_generator",  # counts batches; a validation inside a window would leave a last.ckpt without the
        ["trainer.accumulate_grad_batches=2", "++trainer.limit_train_batches=6"],  # window's first gradients)
    ),
    "window": (  # a validation inside the window (after batch 3 of each epoch's 6): its checkpoints, and a crash
        "gpt_generator",  # checkpoint after it, are of the window's start, which the resumed run reads again
        ["trainer.accumulate_grad_batches=2", "++trainer.limit_train_batches=6", "trainer.val_check_interval=3"],
    ),
    "lora": ("gpt_generator", ["adapter=lora", "adapter.dropout=0.1"]),
    "epoch_end": ("gpt_generator", ["trainer.val_check_interval=5"]),  # a validation after each epoch's last step
}
TIMING = ("perf/",)  # columns whose values are timings: present where the reference has them, any value


def rows(run_dir: Path) -> list[tuple[tuple[str, str], ...]]:
    """metrics.csv's rows as sorted (column, value) pairs of their non-empty cells, timings as "…"."""
    with (run_dir / "logs" / "metrics.csv").open(newline="") as f:
        return sorted(
            tuple(sorted((k, "…" if k.startswith(TIMING) else v) for k, v in row.items() if v))
            for row in csv.DictReader(f)
        )


def differences(got: list, want: list, shown: int = 4) -> str:
    """The first ``shown`` rows, by step, that one run has and the other has not, and how many differ."""

    def by_step(row: dict[str, str]) -> int:
        return int(row.get("step", -1))

    missing = sorted((dict(r) for r in want if r not in got), key=by_step)
    extra = sorted((dict(r) for r in got if r not in want), key=by_step)
    return (
        f"{len(missing)} rows missing, the first: {missing[:shown]}; "
        f"{len(extra)} rows not in the uninterrupted run, the first: {extra[:shown]}"
    )


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Path]:
    """One uninterrupted run per setup, made when a test first asks for it."""
    made: dict[str, Path] = {}

    def reference(setup: str) -> Path:
        if setup not in made:
            experiment, settings = SETUPS[setup]
            out = tmp_path_factory.mktemp(f"whole_{setup}")
            train(compose_train(experiment, out, *RUN, *settings))
            made[setup] = out
        return made[setup]

    return reference


def interrupted_then_resumed(setup: str, fault: Fault, whole: Path, out: Path) -> None:
    interrupted(setup, fault, whole, out)
    resume(out)


def interrupted(setup: str, fault: Fault, whole: Path, out: Path) -> None:
    """``setup``'s run into ``out``, interrupted by ``fault``."""
    experiment, settings = SETUPS[setup]
    tokenizer = f"data.tokenizer_path={whole / 'tokenizer.json'}"  # WordPiece training is not deterministic
    with pytest.raises(KeyboardInterrupt), injected(fault):  # SIGTERM ends in the same "resume with" line
        train(compose_train(experiment, out, *RUN, *settings, tokenizer))
    assert fault.fired


def resumed_and_interrupted(out: Path, fault: Fault) -> None:
    """``zoo-train resume=<out>``, interrupted by ``fault``."""
    with pytest.raises(KeyboardInterrupt), injected(fault):
        train(resumed_config(OmegaConf.create({"resume": str(out)}), []))
    assert fault.fired


def resume(out: Path) -> None:
    """``zoo-train resume=<out>``, in this process: the run's own config, from its furthest checkpoint."""
    with injected(None):
        train(resumed_config(OmegaConf.create({"resume": str(out)}), []))


GENERATOR = [  # every phase, interrupted by a raised KeyboardInterrupt; the signals at some of them
    *[(phase, 4 if phase in ("validation", "checkpoint") else 6, "raise") for phase in (
        "fetch", "forward", "backward", "update", "batch_end", "validation", "checkpoint"
    )],
    ("forward", 7, "raise"),  # mid-epoch
    ("update", 3, "raise"),  # a step whose throughput row is due
    ("update", 5, "raise"),  # the epoch's last step
    ("epoch_end", 5, "raise"),  # the epoch's end: its last step done, the epoch counted as run, not yet as done
    ("epoch_end", 5, "sigint"),
    ("update", 5, "sigterm"),  # in the epoch's last step: Lightning stops once the epoch is counted done
    ("epoch_start", 6, "raise"),  # the next epoch started, none of its batches read
    ("backward", 7, "sigint"),
    ("update", 6, "sigint"),  # held until the update is done
    ("batch_end", 3, "sigterm"),
    ("validation", 4, "sigterm"),
    ("checkpoint", 4, "sigint"),
]  # fmt: skip
OTHERS = [  # a representative subset for the other setups
    ("translator", "backward", 6, "raise"),
    ("translator", "update", 7, "raise"),
    ("translator", "validation", 4, "raise"),
    ("packing", "fetch", 6, "raise"),
    ("packing", "update", 7, "raise"),
    ("accumulation", "forward", 5, "raise"),  # the step's second micro-batch: the first one's gradients are lost
    ("accumulation", "fetch", 5, "raise"),
    ("accumulation", "update", 5, "raise"),
    ("accumulation", "update", 3, "raise"),  # the epoch's last step
    ("accumulation", "validation", 4, "raise"),
    ("window", "validation", 1, "raise"),  # inside the validation that comes in step 2's window (1 step taken)
    ("window", "forward", 2, "raise"),  # the window's last micro-batch, after that validation and its last.ckpt
    ("lora", "backward", 6, "raise"),
    ("lora", "update", 6, "sigint"),
    ("lora", "checkpoint", 4, "raise"),
    ("epoch_end", "validation", 5, "raise"),  # the validation after an epoch's last step: run again in that epoch
    ("epoch_end", "validation", 5, "sigterm"),
    ("epoch_end", "update", 5, "sigint"),  # held to the step's end, before its validation
    ("epoch_end", "checkpoint", 5, "raise"),
]


@pytest.mark.parametrize("phase,step,how", GENERATOR, ids=[f"{p}-{s}-{h}" for p, s, h in GENERATOR])
def test_the_generator_resumes_exactly_wherever_it_is_interrupted(references, tmp_path, phase, step, how):
    whole = references("generator")
    interrupted_then_resumed("generator", Fault(phase, step, how), whole, tmp_path / "run")
    got, want = rows(tmp_path / "run"), rows(whole)
    assert got == want, differences(got, want)


@pytest.mark.parametrize("setup,phase,step,how", OTHERS, ids=["-".join(map(str, case)) for case in OTHERS])
def test_the_translator_packing_accumulation_and_lora_resume_exactly(references, tmp_path, setup, phase, step, how):
    whole = references(setup)
    interrupted_then_resumed(setup, Fault(phase, step, how), whole, tmp_path / "run")
    got, want = rows(tmp_path / "run"), rows(whole)
    assert got == want, differences(got, want)


def test_an_interrupt_while_a_resumed_run_is_set_up_leaves_its_checkpoint_to_resume_from(references, tmp_path):
    """Ctrl-C before the resumed run has restored its checkpoint or read a batch: the interrupt's line (no
    error of its own), the checkpoint it was resuming from left as it was, and the next resume exact."""
    whole = references("generator")
    out = tmp_path / "run"
    interrupted("generator", Fault("forward", 7), whole, out)
    checkpoint = out / "checkpoints" / "on_exception.ckpt"
    saved = checkpoint.read_bytes()
    resumed_and_interrupted(out, Fault("setup", 0))
    assert checkpoint.read_bytes() == saved
    resume(out)
    got, want = rows(out), rows(whole)
    assert got == want, differences(got, want)


def test_the_checkpoint_of_a_validation_run_again_resumes_after_it(references, tmp_path):
    """Ctrl-C inside the validation after step 4; the resumed run runs it again, whole, and writes last.ckpt at
    its end; that run is killed (kill -9: no on_exception.ckpt) in step 6. Resumed from that last.ckpt, the run
    goes on after the validation (not into it once more, from its middle), every row as in a run never stopped."""
    whole = references("generator")
    out = tmp_path / "run"
    interrupted("generator", Fault("validation", 4), whole, out)
    resumed_and_interrupted(out, Fault("forward", 6))
    (out / "checkpoints" / "on_exception.ckpt").unlink()  # what kill -9 leaves: the validation's last.ckpt
    resume(out)
    got, want = rows(out), rows(whole)
    assert got == want, differences(got, want)


def test_a_second_interrupt_after_a_resume_from_inside_a_backward_counts_no_update_twice(references, tmp_path):
    """Ctrl-C inside step 4's backward (Lightning had begun counting its update); the resumed run takes step 4
    and is stopped by SIGTERM inside the validation after it. Its crash checkpoint is of step 4, not 5 (an
    update begun and not done was counted once more), and the run resumed from it labels every row as the run
    that never stopped (found by scripts/soak_resume.py: a validation a step late, the later steps one ahead)."""
    whole = references("generator")
    out = tmp_path / "run"
    interrupted("generator", Fault("backward", 4, "sigint"), whole, out)
    resumed_and_interrupted(out, Fault("validation", 4, "sigterm"))
    assert torch.load(out / "checkpoints" / "on_exception.ckpt", weights_only=True)["global_step"] == 4
    resume(out)
    got, want = rows(out), rows(whole)
    assert got == want, differences(got, want)


KILLS = [
    ("generator", "backward", 6),
    ("generator", "checkpoint", 8),  # inside the second validation's save: the first one's last.ckpt is left
    ("window", "forward", 2),  # the last.ckpt of a validation inside the window: of the window's start
]


@pytest.mark.slow
@pytest.mark.parametrize("setup,phase,step", KILLS, ids=["-".join(map(str, case)) for case in KILLS])
def test_a_run_killed_with_sigkill_resumes_exactly_from_its_last_checkpoint(references, tmp_path, setup, phase, step):
    """kill -9 leaves no crash checkpoint: the resume starts from last.ckpt (inside a checkpoint's save, the
    one before it: the write is atomic) and repeats the steps after it."""
    whole = references(setup)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "ZOO_TEST_FAULT": f"{phase}:{step}:sigkill",
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": str(torch.get_num_threads()),  # this process's threads: the resume runs here (a thread
        # count of its own would add in another order and part from the reference in the last bits)
        "HYDRA_FULL_ERROR": "0",
        "PYTHONWARNINGS": "ignore",
    }
    args = [*command(setup), f"hydra.run.dir={out}", f"data.tokenizer_path={whole / 'tokenizer.json'}"]
    killed = subprocess.run(
        [sys.executable, "-m", "fault_injection", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (out / "checkpoints" / "on_exception.ckpt").exists()
    resume(out)
    got, want = rows(out), rows(whole)
    assert got == want, differences(got, want)


def command(setup: str) -> list[str]:
    """The zoo-train arguments of ``setup``'s run (that of the tests in this process, as a command line):
    for a subprocess, and for scripts/soak_resume.py."""
    from test_tasks import STEPS, TINY

    experiment, settings = SETUPS[setup]
    return [f"experiment={experiment}", *TINY[experiment], *STEPS, *RUN, *settings]

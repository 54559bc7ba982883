"""A trained translator through ``zoo-export format=hf`` (issue 20, item 9): the folder decodes in
transformers as the task decodes in zoo. Random weights never end a sentence, so the old check (zoo
without EOS against transformers forced past it by ``min_new_tokens``) passed on them and refused
every trained model; this one is trained until it writes ``</s>``."""

from __future__ import annotations

import pytest
import torch

from tasks.cli.loading import load_task
from tasks.cli.train.training import train

transformers = pytest.importorskip("transformers")

from test_reliability import run  # noqa: E402
from test_tasks import compose_train  # noqa: E402

pytestmark = pytest.mark.slow
SOURCES = ["forty-two", "seven", "ninety-nine", "one hundred", "thirteen", "sixty-one"]


def test_a_trained_translator_exports_and_decodes_in_transformers_as_in_zoo(tmp_path):
    run_dir = tmp_path / "run"
    train(
        compose_train(
            "t5_translator",
            run_dir,
            "trainer.max_steps=240",
            "trainer.val_check_interval=120",
            "optimizer.lr=3e-3",
            "test=false",
            f"model.logit_scale={32**-0.5}",
        )
    )  # T5's tied head at TINY's d_model=32
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    out = tmp_path / "hf"
    done = run("export", f"ckpt_path={ckpt}", "format=hf", f"out={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    task, _ = load_task(ckpt)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = hf.generate(**batch)  # the folder's own generation_config.json
        ours = task.model.generate(
            batch["input_ids"], attention_mask=batch["attention_mask"], **task.generation_settings()
        )
    eos = hf.config.eos_token_id
    ended = [eos in row[1:] for row in ours.tolist()]
    assert sum(ended) >= len(SOURCES) // 2, ours.tolist()  # trained: most translations end before the limit
    assert theirs.tolist() == ours.tolist()
    texts = tokenizer.batch_decode(theirs, skip_special_tokens=True)
    assert texts == task.translate_ids(batch["input_ids"], batch["attention_mask"])

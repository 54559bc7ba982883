"""zoo-export: a checkpoint as a portable folder, ``zoo-export ckpt_path=<ckpt> out=<folder> format=<name>``.

The formats are the classes of :data:`tasks.cli.export.formats.EXPORT_FORMATS` (safetensors, onnx, hf,
gguf): each names its files, writes and checks them, and says what the model card says about them.

Every format is written into a temporary sibling of ``out=`` and checked there; a new or empty
``out=`` is then that folder, renamed whole (a failure or a kill leaves nothing under its name).
``out=`` may also be a folder a previous zoo-export wrote: its config.json carries a ``zoo_export``
record listing the files that export wrote. Then only the files this export writes are replaced,
each by an atomic rename (config.json last); nothing else in the folder is touched. Any other
non-empty folder is refused unless ``overwrite=true``, which still replaces only those files
(``format=hf`` writes a new folder only). ``out=`` is never a symbolic link, a file, or below a file
(tasks/cli/export/destination.py).

onnxruntime (format=onnx) and llama.cpp (format=gguf, where llama-cpp-python is installed) check the
file in a child process (tasks/cli/export/checker.py). When one crashes, hangs past ``checker.timeout`` or
cannot be imported, the export is kept whole and zoo-export prints what the other checks found, then
one line on stderr (``zoo: Unchecked: llama.cpp crashed (SIGSEGV) while checking out/model.gguf; the
file was written and is unchecked: ...``) and exits with status 3; ``checker.unchecked=refuse`` writes
nothing instead (exit 2). A check that runs and disagrees refuses the export either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tasks.cli.boundary import fail, user_errors
from tasks.cli.console import quiet_libraries
from tasks.cli.export.card import model_card
from tasks.cli.export.checker import Unchecked
from tasks.cli.export.destination import check_out
from tasks.cli.export.formats import EXPORT_FORMATS
from tasks.cli.loading import task_and_checkpoint
from tasks.errors import UserError

UNCHECKED_EXIT = 3  # the export was written and kept, but its runtime could not check it


@user_errors
def run(cfg: DictConfig) -> float:
    """zoo-export on the config Hydra composed (tasks.cli.verbs.export)."""
    for key in ("ckpt_path", "out"):
        if OmegaConf.is_missing(cfg, key):
            raise UserError(f"{key}= is not set; zoo-export ckpt_path=<checkpoint> out=<folder> [format=onnx]")
    form = EXPORT_FORMATS.get(cfg.format, field="format").from_config(cfg)
    if not isinstance(cfg.overwrite, bool):
        raise UserError(f"overwrite={cfg.overwrite!r} must be true or false")
    form.require()
    quiet_libraries()
    out = Path(cfg.out).expanduser()
    check_out(out)
    task, checkpoint = task_and_checkpoint(cfg.ckpt_path)
    task.merge_adapter()  # a LoRA run is exported as the dense model it computes
    task.model = task.model.with_vocab_multiple(None)  # every format holds the true vocabulary, no padding rows
    form.check_task(task)
    form.check_destination(task, out, overwrite=cfg.overwrite)
    command = " ".join(["zoo-export", *sys.argv[1:]])
    card = model_card(task, checkpoint, fmt=form.name, command=command, hf_class=form.card_class(task))
    try:
        diff, said = form.write(task, checkpoint, out, card)
    except Unchecked as unchecked:  # written whole; its runtime crashed, hung or could not be imported
        if unchecked.said is not None:
            print(unchecked.said)
        fail(unchecked, UNCHECKED_EXIT)
    print(said)
    return diff

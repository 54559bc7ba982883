"""A verb refuses what Hydra cannot compose before it imports Lightning and the models, and zoo-info
computes its table without torch's compiler: a typo costs a second, not five (issue 37, item 7)."""

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tasks.data import DATA_MODULES
from tasks.data.settings import SETTINGS

TYPOS = [
    ("model/position=ropee", "did you mean model/position=rope"),
    ("model.n_layer=3", "did you mean model.n_layers=3"),
    ("data.seq_lenn=3", "did you mean data.seq_len=3"),
    ("optimizer.lr=-1", "optimizer.lr=-1 must be > 0"),  # values out of range (tasks.cli.values) too
    ("data.batch_size=0", "data.batch_size=0 must be > 0"),
]


def _imported_after(verb_call: str, argv: list[str], cwd=None) -> subprocess.CompletedProcess:
    """Run ``verb_call`` in a fresh interpreter with ``argv``; it prints the modules it imported
    that matter here, after the verb ended."""
    code = (
        f"import sys; sys.argv = {argv!r}\n"
        f"try:\n    {verb_call}\nexcept SystemExit as e:\n    print('exit', e.code)\n"
        "print('imported', sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torchmetrics'}),"
        " 'torch._dynamo' in sys.modules)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize(("override", "fix"), TYPOS)
def test_a_typo_is_refused_before_lightning_is_imported(override, fix, tmp_path):
    done = _imported_after("from tasks.cli.verbs import train; train()", ["zoo-train", override], tmp_path)
    assert "exit 2" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob(".hydra"))
    assert done.stdout.splitlines()[-1] == "imported [] False"
    assert fix in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("verb", "typo", "fix"),
    [
        ("evaluate", "ckpt_pth=x", "did you mean ckpt_path=x"),
        ("generate", "promt=x", "did you mean prompt=x"),
        ("export", "ckpt_pth=x", "did you mean ckpt_path=x"),
        ("attention", "promt=x", "did you mean prompt=x"),
    ],
)
def test_every_verb_refuses_a_typo_before_lightning_is_imported(verb, typo, fix):
    done = _imported_after(f"from tasks.cli.verbs import {verb}; {verb}()", [f"zoo-{verb}", typo])
    assert "exit 2" in done.stdout, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "imported [] False"
    assert fix in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_console_scripts_are_the_light_entries():
    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    verbs = {name: target for name, target in scripts.items() if name not in ("zoo-info", "zoo-sweep-report")}
    assert verbs and all(target.startswith("tasks.cli.verbs:") for target in verbs.values())


def test_zoo_info_builds_no_compiler():
    done = _imported_after("from zoo.cli import info_main; info_main()", ["zoo-info", "gpt-tiny", "llama2-7b"])
    assert "gpt-tiny" in done.stdout and "llama2-7b" in done.stdout, done.stderr
    assert done.stdout.splitlines()[-1] == "imported [] False"


def test_each_data_module_takes_its_declared_settings():
    assert sorted(SETTINGS) == sorted(DATA_MODULES.names())
    for name, settings in SETTINGS.items():
        assert DATA_MODULES.get(name).Settings is settings
    with pytest.raises(TypeError, match="unexpected keyword argument 'seq_lenn'"):
        DATA_MODULES.get("LMDataModule")(source="stdlib_code", seq_lenn=3)
    module = DATA_MODULES.get("MLMDataModule")(source="stdlib_code", mask_prob=0.3, seq_len=16)
    defaults = {f.name: f.default for f in dataclasses.fields(SETTINGS["MLMDataModule"])}
    assert (module.mask_prob, module.seq_len, module.batch_size) == (0.3, 16, defaults["batch_size"])


def test_import_zoo_leaves_the_converters_until_they_are_used():
    code = (
        "import sys, zoo\n"
        "zoo.build_model(zoo.get_config('gpt-tiny'))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('zoo.hf', 'zoo.gguf'))))\n"
        "print(zoo.from_hf.__module__, zoo.read_gguf.__module__, zoo.hf.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["[]", "zoo.hf zoo.gguf.loader zoo.hf"], done.stderr


def test_building_a_decoder_leaves_generation_until_it_generates():
    generation = ("zoo.generation", "zoo.decoding", "zoo.sampling", "zoo.beam_search", "zoo.prompts", "zoo.logits")
    code = (
        "import sys, torch, zoo\n"
        "model = zoo.build_model(zoo.get_config('gpt-tiny'))\n"
        f"print(sorted(m for m in {generation!r} if m in sys.modules))\n"
        "out = model.generate(torch.tensor([[1, 2]]), 3, eos_token_id=None)\n"
        f"print(out.shape[1], sorted(m for m in {generation!r} if m in sys.modules) == sorted({generation!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines() == ["[]", "5 True"], done.stderr

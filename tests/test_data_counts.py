"""A count under data.* that no data module can use (``data.max_records=-5`` read all records but five,
as ``records[:-5]``) and a misspelt key under data.source_args (read as a column name before) are
refused in one line before anything is read: one rule each, asked by zoo-train when the config is
composed and by a data module when it is built (tasks/data/settings.py ``check_settings``,
tasks/data/sources/base.py ``check_source``)."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir
from test_prepared import corpus, module

import zoo
from tasks.cli.boundary import user_errors
from tasks.cli.schemas import conf_dir
from tasks.cli.values import check_values
from tasks.cli.verbs import _train_job
from tasks.data import ClassificationDataModule, LMDataModule, TranslationDataModule
from tasks.data.sources import load_records
from tasks.errors import DataError


def composed(*overrides: str, data: str = "local_text", path: str = "unused"):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=[f"data={data}", f"data.source_args.path={path}", *overrides])


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("data.max_records=-5", "data.max_records=-5 must be > 0; leave it out (null) to read every record"),
        ("data.max_records=0", "data.max_records=0 must be > 0"),
        ("data.max_records=2.5", "data.max_records=2.5 must be a whole number"),
        ("data.batch_size=-1", "data.batch_size=-1 must be > 0"),
        ("data.seq_len=-16", "data.seq_len=-16 must be > 0"),
        ("data.vocab_size=-300", "data.vocab_size=-300 must be > 0"),
        ("data.num_workers=-1", "data.num_workers=-1 must be >= 0"),
        ("data.tokenizer_sample_mb=-1", "data.tokenizer_sample_mb=-1 must be > 0"),
        ("data.val_fraction=-0.1", "data.val_fraction=-0.1 must be a number in [0.0, 1.0]"),
        ("data.test_fraction=2", "data.test_fraction=2 must be a number in [0.0, 1.0]"),
        ("data.batch_size=abc", "data.batch_size='abc' must be a finite number"),
    ],
)
def test_a_count_no_data_module_can_use_is_refused_at_composition(override, said):
    with pytest.raises(zoo.ConfigError, match="^" + re.escape(said)):
        check_values(composed(override))


def test_zoo_train_refuses_a_negative_max_records_in_one_line_before_reading(tmp_path, capsys):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    cfg = composed("data.max_records=-5", f"data.cache_dir={cache}", f"paths.output_dir={tmp_path / 'run'}", path=text)
    with pytest.raises(SystemExit) as stop:
        user_errors(_train_job)(cfg)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.strip() == (
        "zoo: ConfigError: data.max_records=-5 must be > 0; leave it out (null) to read every record"
    )
    assert not cache.exists()  # nothing was read or prepared


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"max_records": -5}, "data.max_records=-5 must be > 0"),
        ({"batch_size": 0}, "data.batch_size=0 must be > 0"),
        ({"mask_prob": 0}, None),  # LMDataModule takes no mask_prob: a TypeError names it, as before
    ],
)
def test_a_data_module_refuses_the_same_counts_when_built(tmp_path, settings, said):
    if said is None:
        with pytest.raises(TypeError, match="mask_prob"):
            module(tmp_path / "missing", tmp_path / "cache", **settings)
        return
    with pytest.raises(zoo.ConfigError, match=f"^{said}"):
        module(tmp_path / "missing", tmp_path / "cache", **settings)  # before the missing path is looked at


@pytest.mark.parametrize(
    ("source", "args", "said"),
    [
        ("stdlib_code", {"max_files": -5}, "data.source_args.max_files=-5 must be a whole number > 0"),
        ("numbers", {"n": -5}, "data.source_args.n=-5 must be a whole number > 0"),
        ("numbers", {"max_number": 0}, "data.source_args.max_number=0 must be a whole number > 0"),
        ("numbers", {"n": 2.5}, "data.source_args.n=2.5 must be a whole number > 0"),
        ("numbers", {"seed": -1}, "data.source_args.seed=-1 must be a whole number >= 0"),
    ],
)
def test_a_count_of_a_source_is_refused_before_the_source_reads(source, args, said):
    with pytest.raises(DataError, match="^" + re.escape(said)):
        TranslationDataModule(source=source, source_args=args) if source == "numbers" else LMDataModule(
            source=source, source_args=args
        )
    with pytest.raises(DataError, match="^" + re.escape(said)):
        load_records(source, **args)


def test_a_misspelt_source_argument_gets_a_did_you_mean_before_it_is_read_as_a_column(tmp_path):
    text = corpus(tmp_path / "text")
    with pytest.raises(DataError) as error:
        LMDataModule(source="local", source_args={"path": str(text), "sampleby": "paragraph"}, cache_dir=str(tmp_path))
    said = str(error.value)
    assert said.startswith("data.source_args.sampleby=paragraph: data source 'local' takes no argument 'sampleby'")
    assert said.endswith("(did you mean 'sample_by'?)") and "\n" not in said
    assert not (tmp_path / "tokens").exists()
    with pytest.raises(DataError, match=r"takes no argument 'label'; .* a column for text, key, group"):
        LMDataModule(source="local", source_args={"path": str(text), "label": "category"})  # LM reads no label


def test_zoo_train_gives_the_did_you_mean_in_one_line(tmp_path, capsys):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    overrides = ["+data.source_args.sampleby=paragraph", f"data.cache_dir={cache}", f"paths.output_dir={tmp_path}/r"]
    with pytest.raises(SystemExit) as stop:
        user_errors(_train_job)(composed(*overrides, path=text))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("zoo: DataError: data.source_args.sampleby=paragraph: ") and "did you mean 'sample_by'" in err
    assert not cache.exists()


def test_renames_of_the_fields_a_module_reads_still_work(tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("sentence,category\n" + "".join(f"text number {i},{'ab'[i % 2]}\n" for i in range(60)))
    dm = ClassificationDataModule(
        source="local", source_args={"path": str(rows), "text": "sentence", "label": "category"}, vocab_size=100
    )
    assert dm.source_args["label"] == "category"
    records = load_records("local", path=str(rows), text="sentence", anything="category")  # no needs: any rename
    assert records[0]["anything"] == "a"

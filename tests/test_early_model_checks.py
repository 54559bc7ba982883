"""A model value that cannot work is refused as fast as a typo (issue 43, friction 3): zoo-train asks the
library's own rules (``ModelConfig.validate``, the components' ``check``) before it imports Lightning and
the tasks, and says in one line which field is wrong and how to fix it."""

import pytest
from test_startup import _imported_after

BAD_MODELS = [
    (["model.n_layers=-1"], "n_layers=-1 must be a positive integer"),
    (["model.n_layers=0"], "n_layers=0 must be a positive integer"),
    (["model.d_model=0"], "d_model=0 must be a positive integer"),
    (["model.n_heads=5"], "n_heads=5 does not divide d_model=128; choose n_heads among [1, 2, 4, 8"),
    (["model.n_kv_heads=3"], "n_kv_heads=3 does not divide n_heads=4; choose among [1, 2, 4]"),
    (["model.dropout=1.5"], "dropout=1.5 must lie in [0, 1)"),
    (["model/mask=sliding_window"], "mask='sliding_window' needs window"),
    (
        ["model/mask=sliding_window", "model.window=1000"],
        "window=1000 is wider than max_seq_len=256, the longest sequence the model takes",
    ),
    (["model/position=alibi", "model.rope_base=50000"], "rope_base=50000.0 is read by position=rope"),
    (
        ["model/position=learned", "data.seq_len=1000"],
        "data.seq_len=1000 is longer than the learned position table (model.max_seq_len=256)",
    ),
]


@pytest.mark.parametrize(("overrides", "fix"), BAD_MODELS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_model_value_is_refused_before_lightning_is_imported(overrides, fix, tmp_path):
    done = _imported_after("from tasks.cli.verbs import train; train()", ["zoo-train", *overrides], tmp_path)
    assert "exit 2" in done.stdout, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "imported [] False", done.stdout  # no Lightning, no torch compiler
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and fix in done.stderr, done.stderr
    assert done.stderr.startswith("zoo: ConfigError: ")
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob(".hydra"))


def test_a_window_as_wide_as_the_context_is_allowed():
    """The rule refuses a window wider than max_seq_len, not one that sees every position."""
    from conftest import tiny_config

    assert tiny_config(mask="sliding_window", window=64).validate().window == 64
    assert tiny_config(mask="sliding_window", window=64, max_seq_len=None).validate().window == 64

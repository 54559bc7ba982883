"""The calculator against the article and against counted FLOPs; the zoo-info command; plug-ins."""

import json
import sys

import pytest
import torch
from conftest import tiny_config
from torch.utils.flop_counter import FlopCounterMode

import zoo
from zoo import registry
from zoo.cli import info_main


def test_llama2_7b_kv_cache_matches_the_article():
    # 2 x 32 layers x 32 heads x 128 dims x 4096 tokens x 2 bytes ~ 2.1 GB; 128K tokens ~ 64 GiB
    assert zoo.stats("llama2-7b", seq_len=4096, dtype=torch.bfloat16).kv_cache_bytes == 2_147_483_648
    assert zoo.stats("llama2-7b", seq_len=131072, dtype=torch.bfloat16).kv_cache_bytes == 64 * 2**30


def test_gqa_shrinks_the_cache_by_the_group_size():
    full = zoo.stats("llama2-70b", seq_len=4096).kv_cache_bytes
    assert full == 2 * 80 * 8 * 128 * 4096 * 2
    assert zoo.stats("llama2-70b", seq_len=4096, n_kv_heads=64).kv_cache_bytes == 8 * full


def test_parameter_split():
    s = zoo.stats("gpt2")
    assert s.params == 124_439_808
    assert s.embedding_params == 50257 * 768 + 1024 * 768
    assert s.non_embedding_params == s.params - s.embedding_params
    assert s.flops_per_token_train == 3 * s.flops_per_token_forward


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_forward_flops_match_a_flop_counter(arch):
    # the math kernel, because the flop counter does not see inside the fused CPU attention kernel
    cfg = tiny_config(
        arch=arch, d_model=64, d_ff=256, vocab_size=512, n_layers=3, bias=False, position="rope", attention="math"
    )
    model = zoo.build_model(cfg)
    T = 32
    x = torch.randint(0, 512, (2, T))
    with FlopCounterMode(display=False) as counter:
        model(x) if arch == "decoder" else model(x, x)
    # per token of the batch (encoder_decoder: per source+target pair of tokens, S == T)
    counted = counter.get_total_flops() / (2 * T)
    expected = zoo.stats(cfg, seq_len=T).flops_per_token_forward
    assert counted == pytest.approx(expected, rel=0.01)  # stats also counts norm weights: ~0.2% here


def test_zoo_info_prints_a_table_and_json(capsys):
    info_main(["llama2-7b", "--seq-len", "4096"])
    out = capsys.readouterr().out
    assert "llama2-7b" in out and "6.74 B" in out and "2.15 GB" in out
    info_main(["t5*", "--json", "--dtype", "float32", "--seq-len", "512"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["t5-base", "t5-small", "t5-tiny"]
    assert rows[1]["params"] == 60_506_624
    with pytest.raises(SystemExit):
        info_main(["nonexistent*"])


def test_plugins_register_through_entry_points(tmp_path, monkeypatch):
    (tmp_path / "zoo_test_plugin.py").write_text(
        "import torch, zoo\n"
        "@zoo.register('ffn', 'plugin_ffn')\n"
        "class PluginFFN(zoo.sublayer.FeedForward):\n"
        "    @classmethod\n"
        "    def from_config(cls, cfg):\n"
        "        return cls()\n"
        "    def forward(self, x):\n"
        "        return torch.tanh(x)\n"
    )
    dist = tmp_path / "zoo_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zoo-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[zoo.plugins]\nplugin = zoo_test_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "plugin_ffn" in zoo.list_components()["ffn"]
        model = zoo.build_model(tiny_config(ffn="plugin_ffn"))
        assert torch.isfinite(model(torch.randint(0, 61, (1, 4)))).all()
    finally:
        if "plugin_ffn" in registry.FFN:
            registry.FFN.unregister("plugin_ffn")
        sys.modules.pop("zoo_test_plugin", None)


def test_zoo_info_reads_the_model_of_a_checkpoint_and_of_a_folder(gpt_base, tmp_path, capsys):
    """Issue 37, item 7: the numbers of the model a run trained (its vocabulary is the data's), not only a
    preset's; a zoo model folder and an HF one too; a file that is no checkpoint is one line."""
    info_main([str(gpt_base), "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    task_model = zoo.load_weights_file(gpt_base)["hyper_parameters"]["model"]
    model = zoo.build_model(zoo.ModelConfig.from_dict(task_model))
    assert row["params"] == zoo.count_parameters(model) and row["name"].endswith("last.ckpt")
    zoo.save_pretrained(model, tmp_path / "folder")
    zoo.to_hf(model, tmp_path / "hf")
    info_main([str(tmp_path / "folder"), str(tmp_path / "hf"), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["params"] for r in rows] == [row["params"]] * 2
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(SystemExit) as end:
        info_main([str(tmp_path / "junk.ckpt")])
    assert end.value.code == 2 and capsys.readouterr().err.startswith("zoo: CheckpointError:")

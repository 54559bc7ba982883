"""LoRA adapters (zoo.adapters): identity at init, only adapters train, merge, fused rows, checkpoints."""

import copy
import json

import pytest
import torch
from conftest import tiny_model
from rounding import assert_rounding_close

import zoo
from zoo import adapters
from zoo.adapters import LoRALinear, resolve_targets
from zoo.sublayer import Sublayer

FORMS = ["encoder", "decoder", "encoder_decoder"]
GQA = dict(n_heads=4, n_kv_heads=2)  # head_dim 8: q rows 0..31, k rows 32..47, v rows 48..63 of qkv


def _outputs(model: zoo.ZooModel) -> torch.Tensor:
    return model(**type(model).example_inputs(model.config, batch=2, length=9))


def _perturb(model: torch.nn.Module) -> None:
    """Give every B a random value, as training would, so that the adapters change the outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)


@pytest.mark.parametrize("arch", FORMS)
def test_adapted_model_equals_its_base_at_init(arch):
    base = tiny_model(arch=arch, **GQA)
    model = adapters.apply(copy.deepcopy(base), rank=4, targets=("q", "k", "v", "out", "ffn"))
    assert adapters.adapted_layers(model)
    torch.testing.assert_close(_outputs(model), _outputs(base), rtol=0, atol=0)
    A = [p for n, p in model.named_parameters() if ".lora_A." in n]
    assert A and all(a.abs().sum() > 0 for a in A)  # a zero A would leave B without a gradient forever


@pytest.mark.parametrize("arch", FORMS)
def test_only_adapter_parameters_get_gradients(arch):
    model = adapters.apply(tiny_model(arch=arch), targets=("q", "v", "ffn"))
    _outputs(model).square().mean().backward()
    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert p.requires_grad and p.grad is not None, name
        else:
            assert not p.requires_grad and p.grad is None, name
    assert any(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if ".lora_B." in n)


def test_a_training_step_changes_only_adapter_parameters():
    model = adapters.apply(tiny_model(), rank=4)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(adapters.trainable_parameters(model).values(), lr=0.1)
    ids = torch.randint(5, 61, (2, 9))
    torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_B." in n for n in changed)  # A's gradient is zero while B is zero


@pytest.mark.parametrize(
    "arch, ffn, targets",
    [
        ("encoder", "gelu", ("q", "k", "v", "out")),
        ("encoder", "swiglu", ("ffn",)),
        ("decoder", "swiglu", ("q", "k", "v", "out", "ffn")),
        ("decoder", "gelu", ("ffn", r"decoder\.blocks\.1\.attn\.qkv")),
        ("encoder_decoder", "gelu", ("q", "v", "cross")),
        ("encoder_decoder", "swiglu", (r"encoder\..*\.ffn\.fc\.up", r".*cross_attn\.kv\.k")),
    ],
)
def test_merge_equals_the_adapted_model(arch, ffn, targets):
    base = tiny_model(arch=arch, ffn=ffn, **GQA)
    model = adapters.apply(copy.deepcopy(base), rank=4, alpha=8, targets=targets)
    _perturb(model)
    adapted = _outputs(model)
    assert (adapted - _outputs(base)).abs().max() > 1e-2  # the adapters do change the outputs
    adapters.merge(model)
    assert not adapters.adapted_layers(model) and model.adapter_config is None
    assert list(model.state_dict()) == list(base.state_dict())
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert all(p.requires_grad for p in model.parameters())
    assert_rounding_close(_outputs(model), adapted, model)


@pytest.mark.parametrize(
    "targets, rows", [(("q",), range(0, 32)), (("v",), range(48, 64)), (("k", "v"), range(32, 64))]
)
def test_a_fused_qkv_adapter_changes_only_its_rows(targets, rows):
    base = tiny_model(**GQA)
    model = adapters.apply(copy.deepcopy(base), rank=3, targets=targets)
    qkv = model.decoder.blocks[0].attn.qkv
    assert set(qkv.lora_B) == set(targets)
    for t in targets:  # one A (r, D) and one B (rows of t, r) per chosen projection
        assert qkv.lora_A[t].shape == (3, 32) and qkv.lora_B[t].shape == (len(rows) // len(targets), 3)
    _perturb(model)
    adapted = _outputs(model)
    adapters.merge(model)
    for merged_block, base_block in zip(model.decoder.blocks, base.decoder.blocks, strict=True):
        diff = (merged_block.attn.qkv.weight - base_block.attn.qkv.weight).abs().sum(dim=1)  # per row
        assert torch.equal(diff.nonzero().flatten(), torch.tensor(list(rows)))
        assert torch.equal(merged_block.attn.out.weight, base_block.attn.out.weight)
    assert_rounding_close(_outputs(model), adapted, model)


def test_trainable_count_is_one_adapter_per_chosen_projection():
    model = adapters.apply(tiny_model(**GQA), rank=4, targets=("q", "v", "out"))
    D, q_rows, v_rows, layers = 32, 32, 16, 2
    assert adapters.count_trainable(model) == layers * 4 * ((D + q_rows) + (D + v_rows) + (D + D))
    assert adapters.count_trainable(model) == sum(p.numel() for p in adapters.trainable_parameters(model).values())


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_cached_generation_with_adapters_equals_the_merged_model(arch):
    model = adapters.apply(
        tiny_model(arch=arch, **GQA),
        rank=4,
        targets=("q", "k", "v", "out", "ffn") + (("cross",) if arch == "encoder_decoder" else ()),
    )
    _perturb(model)
    prompt = torch.randint(5, 61, (2, 5))
    adapted = model.generate(prompt, max_new_tokens=10, eos_token_id=None)
    assert torch.equal(adapted, model.generate(prompt, max_new_tokens=10, eos_token_id=None, use_cache=False))
    adapters.merge(model)
    assert torch.equal(model.generate(prompt, max_new_tokens=10, eos_token_id=None), adapted)


def test_adapter_state_round_trip():
    base = tiny_model(arch="encoder_decoder", tie_embeddings=False)
    model = adapters.apply(copy.deepcopy(base), rank=2, alpha=4, targets=("v", "cross"), trainable=("lm_head",))
    _perturb(model)
    state = adapters.adapter_state_dict(model)
    json.dumps(state["adapter"])  # plain data
    assert set(state["tensors"]) == {n for n in model.state_dict() if ".lora_" in n} | {"lm_head.weight"}
    fresh = adapters.load_adapter(copy.deepcopy(base), state)
    assert fresh.adapter_config == model.adapter_config
    assert set(adapters.trainable_parameters(fresh)) == set(state["tensors"])
    torch.testing.assert_close(_outputs(fresh), _outputs(model), rtol=0, atol=0)


def test_loading_an_adapter_onto_another_model_is_refused():
    state = adapters.adapter_state_dict(adapters.apply(tiny_model(n_layers=3), targets=("v",)))
    other = tiny_model(n_layers=2)
    with pytest.raises(zoo.CheckpointError, match="unexpected.*blocks.2"):
        adapters.load_adapter(other, state)
    assert not adapters.adapted_layers(other) and other.adapter_config is None


def test_none_adapter_trains_everything():
    base = tiny_model()
    model = adapters.apply(copy.deepcopy(base), "none")
    assert not adapters.adapted_layers(model)
    assert adapters.count_trainable(model) == zoo.count_parameters(base)
    state = adapters.adapter_state_dict(model)
    assert state["adapter"]["name"] == "none" and set(state["tensors"]) == dict(base.named_parameters()).keys()


def test_trainable_patterns_unfreeze_a_head():
    model = adapters.apply(tiny_model(tie_embeddings=False), targets=("q",), trainable=("lm_head",))
    trainable = adapters.trainable_parameters(model)
    assert "lm_head.weight" in trainable and "embed.weight" not in trainable
    with pytest.raises(zoo.ConfigError, match="trainable: 'pooler'"):
        adapters.apply(tiny_model(), targets=("q",), trainable=("pooler",))


def test_dropout_acts_on_the_adapter_input_only():
    base = tiny_model()
    model = adapters.apply(copy.deepcopy(base), targets=("out",), dropout=0.5).train()
    torch.testing.assert_close(_outputs(model), _outputs(base), rtol=0, atol=0)  # B = 0: base path not dropped
    _perturb(model)
    assert not torch.equal(_outputs(model), _outputs(model))
    model.eval()
    assert torch.equal(_outputs(model), _outputs(model))


@pytest.mark.parametrize(
    "targets, message",
    [
        (("qq",), r"'qq' selects no layer.*valid names: q, k, v, out, ffn, cross.*Did you mean 'q'"),
        (("cross",), r"'cross' selects no layer of this DecoderModel"),
        (("(",), r"'\(' is neither a target name \(q, k, v, out, ffn, cross\) nor a valid regex"),
        ((), r"targets is empty"),
    ],
)
def test_bad_targets_are_config_errors_naming_the_valid_ones(targets, message):
    model = tiny_model()
    with pytest.raises(zoo.ConfigError, match=message):
        adapters.apply(model, targets=targets)
    assert not adapters.adapted_layers(model) and all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(rank=0), r"rank=0: a LoRA rank must be a positive integer"),
        (dict(rank=-2), r"rank=-2"),
        (dict(rank=2.5), r"rank=2.5"),
        (dict(alpha=0), r"alpha=0"),
        (dict(dropout=1.0), r"dropout=1.0"),
        (dict(name="lorax"), r"adapter='lorax' is not a registered adapter; valid names: lora, none"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(zoo.ConfigError, match=message):
        adapters.apply(tiny_model(), **settings)


def test_applying_twice_is_refused_and_merge_needs_an_adapter():
    model = adapters.apply(tiny_model())
    with pytest.raises(zoo.ConfigError, match="already has an adapter"):
        adapters.apply(model)
    adapters.merge(model)
    with pytest.raises(ValueError, match="has no adapter"):
        adapters.merge(model)


def test_wrapped_layer_keeps_the_base_parameters():
    base = tiny_model()
    qkv = base.decoder.blocks[0].attn.qkv
    adapters.apply(base, targets=("k",))
    wrapped = base.decoder.blocks[0].attn.qkv
    assert isinstance(wrapped, LoRALinear) and wrapped.weight is qkv.weight
    assert "decoder.blocks.0.attn.qkv.weight" in base.state_dict()


def test_a_sublayer_declares_its_fused_segments_and_lora_adapts_each_alone():
    """LoRA asks the sublayer (Sublayer.fused_segments), not its class: a new component with a fused
    projection of its own is adapted segment by segment, and a plain module's Linear is one segment."""

    class TwoHeads(Sublayer):
        def __init__(self) -> None:
            super().__init__()
            self.both = torch.nn.Linear(8, 6)

        def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
            return {"both": [("left", 4), ("right", 2)]}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.both(x)

    class Plain(torch.nn.Sequential):
        adapter_config = None  # what a module LoRA adapts declares (ZooModel does)

    model = Plain(TwoHeads(), torch.nn.Linear(6, 3))
    assert resolve_targets(model, ["0.both.right", "1"]) == {"0.both": ["right"], "1": ["1"]}
    zoo.adapters.apply(model, rank=2, targets=["0.both.right"])
    x = torch.randn(5, 8)
    with torch.no_grad():
        before = model[0](x)
        model[0].both.lora_B["right"].fill_(0.5)  # move only the adapted rows
        after = model[0](x)
    assert set(model[0].both.lora_A) == {"right"}
    assert torch.equal(after[:, :4], before[:, :4]) and not torch.allclose(after[:, 4:], before[:, 4:])

"""Activation checkpointing: same loss and gradients as the plain forward, really recomputed, off in decoding."""

import pytest
import torch
from conftest import tiny_config

import zoo
import zoo.blocks
from zoo.registry import ConfigError

FORMS = ["encoder", "decoder", "encoder_decoder"]
N_LAYERS = 4


def build(arch: str, policy: str, **overrides) -> zoo.ZooModel:
    cfg = tiny_config(
        **{"arch": arch, "n_layers": N_LAYERS, "dropout": 0.2, "activation_checkpointing": policy, **overrides}
    )
    return zoo.build_model(cfg, seed=0).train()


def block_calls(model: zoo.ZooModel) -> list[list[int]]:
    """Per stack, per block: a counter of forward calls, by pre-hooks (a recompute fires them again; it may
    stop early, once it has rebuilt what backward needs, so a post-forward hook would miss it)."""
    counts = [[0] * len(stack.blocks) for stack in model.stacks()]
    for s, stack in enumerate(model.stacks()):
        for b, block in enumerate(stack.blocks):
            block.register_forward_pre_hook(lambda *_, s=s, b=b: counts[s].__setitem__(b, counts[s][b] + 1))
    return counts


def loss_and_grads(model: zoo.ZooModel) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward with dropout drawn from seed 1; padding on the first row."""
    inputs = type(model).example_inputs(model.config, batch=2, length=9)
    torch.manual_seed(1)
    out = model(**inputs)
    weights = torch.linspace(-1, 1, out.shape[-1])  # a fixed direction: every output counts differently
    loss = (out.float() * weights).pow(2).mean()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.fixture
def checkpoint_calls(monkeypatch) -> list[int]:
    """Counts the calls the stack makes to torch.utils.checkpoint.checkpoint."""
    calls = []
    real = zoo.blocks.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(zoo.blocks, "checkpoint", counting)
    return calls


@pytest.mark.parametrize(
    "policy,recomputed",
    [("all", [0, 1, 2, 3]), ("true", [0, 1, 2, 3]), ("every_2", [0, 2]), ("every_3", [0, 3]), ("every_9", [0])],
)
@pytest.mark.parametrize("arch", FORMS)
def test_checkpointed_loss_and_gradients_equal_the_plain_ones(arch, policy, recomputed):
    plain, ours = build(arch, "none"), build(arch, policy)
    counts = block_calls(ours)
    expected_loss, expected = loss_and_grads(plain)
    loss, grads = loss_and_grads(ours)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
    assert grads.keys() == expected.keys() and all(g is not None for g in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    # a checkpointed block runs twice (forward, then again in backward); the others once
    assert counts == [[2 if b in recomputed else 1 for b in range(N_LAYERS)]] * len(ours.stacks())


def test_gradients_reach_a_learned_position_bias_outside_the_blocks():
    """T5's relative bias is computed once per stack and handed to every block inside AttentionInputs."""
    plain = build("encoder_decoder", "none", position="t5_relative")
    ours = build("encoder_decoder", "all", position="t5_relative")
    _, expected = loss_and_grads(plain)
    _, grads = loss_and_grads(ours)
    bias = [name for name in grads if "position" in name]
    assert bias and all(grads[name].abs().sum() > 0 for name in bias)
    for name in bias:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("arch", FORMS)
def test_no_checkpointing_in_eval_mode_or_without_grad(arch, checkpoint_calls):
    model = build(arch, "all")
    counts = block_calls(model)
    inputs = type(model).example_inputs(model.config, batch=2, length=9)
    with torch.no_grad():
        model(**inputs)
    model.eval()
    model(**inputs).pow(2).mean().backward()  # eval: gradients still flow, nothing is recomputed
    assert checkpoint_calls == []
    assert counts == [[2] * N_LAYERS] * len(model.stacks())  # one call in each of the two forwards


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_no_checkpointing_while_a_kv_cache_is_filled(arch, checkpoint_calls):
    """Training mode and grad enabled, but with a cache: a recompute would append the keys twice."""
    plain, ours = build(arch, "none", dropout=0.0), build(arch, "all", dropout=0.0)
    tokens = torch.randint(5, 61, (2, 6))
    outputs = []
    for model in (plain, ours):
        cache = model.new_cache()
        if arch == "decoder":
            out = model(tokens, cache=cache)
        else:
            with torch.no_grad():  # the encoder trains without a cache: it would be checkpointed
                memory = model.encode(tokens)
            out = model.decode(tokens, memory, cache=cache)
        out.pow(2).mean().backward()
        assert cache.length == tokens.shape[1]
        outputs.append(out)
    torch.testing.assert_close(outputs[1], outputs[0])
    assert checkpoint_calls == []


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_generation_with_checkpointing_equals_generation_without(arch, checkpoint_calls):
    prompt = torch.randint(5, 61, (2, 5))
    plain, ours = build(arch, "none"), build(arch, "every_2")
    expected = plain.generate(prompt, 6, eos_token_id=None)
    assert ours.training  # generate() switches to eval for decoding and back
    torch.testing.assert_close(ours.generate(prompt, 6, eos_token_id=None), expected, rtol=0, atol=0)
    torch.testing.assert_close(ours.generate(prompt, 6, eos_token_id=None, use_cache=False), expected, rtol=0, atol=0)
    assert checkpoint_calls == [] and ours.training


def test_the_policy_is_read_from_the_config_and_can_be_changed_on_a_built_stack(checkpoint_calls):
    model = build("decoder", "every_2")
    assert [s.checkpoint_every for s in model.stacks()] == [2]
    model.decoder.checkpoint_every = 0
    model(torch.randint(5, 61, (2, 6))).sum().backward()
    assert checkpoint_calls == []
    model.decoder.checkpoint_every = 1
    model(torch.randint(5, 61, (2, 6))).sum().backward()
    assert len(checkpoint_calls) == N_LAYERS


@pytest.mark.parametrize("policy", ["sometimes", "every_0", "every_x", "every-2", "every_", "2", ""])
def test_an_unknown_policy_is_a_config_error(policy):
    with pytest.raises(ConfigError, match="activation_checkpointing="):
        tiny_config(activation_checkpointing=policy).validate()
    with pytest.raises(ConfigError, match="every_<k>"):
        zoo.build_model(tiny_config(activation_checkpointing=policy))


@pytest.mark.parametrize("policy,every", [("none", 0), ("false", 0), ("all", 1), ("ALL", 1), ("every_4", 4)])
def test_known_policies_validate(policy, every):
    assert tiny_config(activation_checkpointing=policy).validate().checkpoint_every == every

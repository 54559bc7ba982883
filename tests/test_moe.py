"""The mixture-of-experts FFN (``ffn=moe``, zoo/moe.py): routing against a per-token loop written out
by hand, dropless dispatch, the router's two losses against their formulas, a decoder built with it
(causality, cached decoding, training), init, the counters and the refusals. HF parity with Mixtral:
tests/test_hf_mixtral.py."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, tiny_model
from hydra import compose, initialize_config_dir
from torch.utils.flop_counter import FlopCounterMode

import zoo
from tasks.cli.schemas import conf_dir, model_config
from zoo.cli import info_main
from zoo.moe import MoE
from zoo.registry import FFN, MODELS


def _moe(**overrides) -> MoE:
    return FFN.get("moe").from_config(tiny_config(ffn="moe", n_experts=4, **overrides).validate())


def _swiglu(fc: torch.Tensor, proj: torch.Tensor, x: torch.Tensor, fc_b=None, proj_b=None) -> torch.Tensor:
    """One SwiGLU expert on one token x (D,): fc (2F, D) = [gate; up], proj (D, F)."""
    h = fc @ x + (0 if fc_b is None else fc_b)  # (2F,)
    gate, up = h.chunk(2)
    return proj @ (F.silu(gate) * up) + (0 if proj_b is None else proj_b)


def _expert(ffn: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    fc, proj = ffn.experts.fc, ffn.experts.proj
    biases = (None, None) if fc.bias is None else (fc.bias[e], proj.bias[e])
    return _swiglu(fc.weight[e], proj.weight[e], x, *biases)


def _by_hand(ffn: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token alone: softmax over the router's logits, the k most probable experts (by a sort, not
    topk), their weights renormalised or not, the weighted sum of their outputs (+ the shared expert)."""
    out = []
    for token in x.reshape(-1, x.shape[-1]):
        p = torch.softmax(ffn.router.weight @ token, dim=0)  # (E,)
        top = p.argsort(descending=True)[: ffn.top_k]
        w = p[top] / p[top].sum() if ffn.renormalize else p[top]
        y = sum(wi * _expert(ffn, e, token) for wi, e in zip(w, top.tolist(), strict=True))
        if ffn.shared is not None:
            s = ffn.shared
            y = y + _swiglu(s.fc.weight, s.proj.weight, token, s.fc.bias, s.proj.bias)
        out.append(y)
    return torch.stack(out).view_as(x)


def _losses(module: torch.nn.Module, *args, **kwargs) -> dict[str, torch.Tensor]:
    """The aux losses of one forward of ``module`` (a model or an FFN) on these arguments."""
    module(*args, **kwargs)
    return module.aux_losses()


def _perturb_biases(ffn: MoE) -> None:
    with torch.no_grad():
        for name, p in ffn.named_parameters():
            if name.endswith("bias"):
                p.normal_()  # biases start at zero: make them count


# ---- routing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("shared", [False, True])
def test_each_token_gets_the_weighted_sum_of_its_top_k_experts(top_k, renormalize, shared):
    ffn = _moe(moe_top_k=top_k, moe_renormalize=renormalize, moe_shared_expert=shared, bias=shared)
    _perturb_biases(ffn)
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(ffn(x), _by_hand(ffn, x), atol=1e-5, rtol=1e-4)


def test_renormalised_weights_sum_to_one_and_plain_ones_are_the_softmax():
    x = torch.randn(20, 32)
    on, off = _moe(moe_renormalize=True), _moe(moe_renormalize=False)
    off.load_state_dict(on.state_dict())
    logits = on.router(x)
    probs, w_on, chosen = on.route(logits)
    _, w_off, chosen_off = off.route(logits)
    assert torch.equal(chosen, chosen_off) and chosen.shape == (20, 2)
    torch.testing.assert_close(w_on.sum(-1), torch.ones(20))
    torch.testing.assert_close(w_off, probs.gather(1, chosen))
    assert (w_off.sum(-1) < 1 - 1e-3).all()  # two of four experts never hold all the probability here
    assert not torch.allclose(on(x[None]), off(x[None]))


def test_dispatch_is_dropless_when_every_token_prefers_one_expert():
    ffn = _moe(moe_top_k=1)
    with torch.no_grad():
        ffn.router.weight.zero_()
        ffn.router.weight[2] = 1.0  # positive tokens: expert 2 wins every one
    x = torch.rand(4, 16, 32) + 0.1  # 64 tokens, 16x a fair share of one expert
    out = ffn(x)
    _, _, chosen = ffn.route(ffn.router(x.reshape(-1, 32)))
    assert chosen.eq(2).all()
    expected = torch.stack([_expert(ffn, 2, token) for token in x.reshape(-1, 32)])
    torch.testing.assert_close(out.reshape(-1, 32), expected)  # weight 1: every token got its expert
    assert out.abs().sum(-1).gt(0).all()


def test_a_tokens_output_does_not_depend_on_the_rest_of_the_batch():
    ffn = _moe(moe_top_k=2)
    x = torch.randn(3, 7, 32)
    alone = torch.cat([ffn(x[:, i : i + 1]) for i in range(7)], dim=1)
    torch.testing.assert_close(ffn(x), alone)


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_traceable_dense_path_computes_what_the_sorted_dispatch_does(top_k):
    ffn = _moe(moe_top_k=top_k, bias=True)
    _perturb_biases(ffn)
    x = torch.randn(19, 32)
    probs, weights, chosen = ffn.route(ffn.router(x))
    counts = torch.bincount(chosen.flatten(), minlength=4)
    torch.testing.assert_close(ffn._dense(x, weights, chosen, counts), ffn._dispatch(x, weights, chosen, counts))


@pytest.mark.slow
def test_an_onnx_export_routes_every_input_as_pytorch_does(tmp_path):
    """Traced at one input, run at another: the graph holds no routing of the traced one."""
    onnxruntime = pytest.importorskip("onnxruntime")
    model = tiny_model(ffn="moe", attention="math", moe_shared_expert=True)
    inputs = model.example_inputs(model.config)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    torch.onnx.export(model, (), kwargs=inputs, dynamic_shapes=dims, dynamo=True).save(tmp_path / "m.onnx")
    other = model.example_inputs(model.config, batch=3, length=11, generator=torch.Generator().manual_seed(1))
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: t.numpy() for name, t in other.items()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(**other), atol=1e-4, rtol=1e-4)


# ---- the router's losses -------------------------------------------------------------------------
def test_the_losses_are_their_formulas_times_their_coefficients():
    ffn = _moe(moe_top_k=2, moe_aux_loss_coef=0.3, moe_z_loss_coef=0.02)
    x = torch.randn(2, 11, 32)
    losses = _losses(ffn, x)
    logits = ffn.router(x.reshape(-1, 32))  # (N, E)
    probs = logits.softmax(-1)
    chosen = probs.topk(2, dim=-1).indices  # (N, 2)
    f = F.one_hot(chosen, 4).float().sum((0, 1)) / chosen.numel()  # share of the N*k assignments
    balance = 4 * (f * probs.mean(0)).sum()  # Switch Transformer eq. 4
    z = torch.logsumexp(logits, -1).pow(2).mean()  # ST-MoE eq. 5
    assert set(losses) == {"moe_aux_loss", "moe_z_loss"}
    torch.testing.assert_close(losses["moe_aux_loss"], 0.3 * balance)
    torch.testing.assert_close(losses["moe_z_loss"], 0.02 * z)
    assert balance > 1  # random routing is not perfectly balanced


def test_uniform_routing_has_balance_loss_one_and_z_loss_log_e_squared():
    ffn = _moe(moe_aux_loss_coef=1.0, moe_z_loss_coef=1.0)
    with torch.no_grad():
        ffn.router.weight.zero_()  # every expert equally probable
    losses = _losses(ffn, torch.randn(1, 8, 32))
    torch.testing.assert_close(losses["moe_aux_loss"], torch.tensor(1.0))
    torch.testing.assert_close(losses["moe_z_loss"], torch.tensor(math.log(4) ** 2))


@pytest.mark.parametrize(
    ("aux", "z", "names"), [(0.0, 0.1, {"moe_z_loss"}), (0.1, 0.0, {"moe_aux_loss"}), (0.0, 0.0, set())]
)
def test_a_loss_whose_coefficient_is_zero_is_left_out(aux, z, names):
    ffn = _moe(moe_aux_loss_coef=aux, moe_z_loss_coef=z)
    assert ffn.aux_losses() == {}  # no forward yet
    assert set(_losses(ffn, torch.randn(1, 5, 32))) == names


def test_padding_at_the_end_leaves_the_losses_of_the_rows_cut_before_it():
    model = tiny_model(ffn="moe", moe_aux_loss_coef=0.3, moe_z_loss_coef=0.02)
    ids, mask = torch.randint(5, 61, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    padded = _losses(model, ids, mask.index_fill(1, torch.arange(6, 9), 0))  # causal: no real position sees a pad
    cut, plain, unpadded = _losses(model, ids[:, :6]), _losses(model, ids), _losses(model, ids, mask)
    for name in ("moe_aux_loss", "moe_z_loss"):
        torch.testing.assert_close(padded[name], cut[name])
        assert not torch.allclose(padded[name], plain[name]) and torch.equal(unpadded[name], plain[name])


@pytest.mark.parametrize("static", [False, True])  # a static cache's padding mask covers every slot
def test_each_layers_losses_are_those_of_its_real_new_tokens_alone(static):
    """A left-padded prompt into a KV cache, then one token per row: each FFN counts the real ones only."""
    model = tiny_model(ffn="moe", moe_aux_loss_coef=0.3, moe_z_loss_coef=0.02)
    ids, mask = torch.randint(5, 61, (3, 7)), (torch.arange(7) >= torch.tensor([[0], [3], [5]])).long()  # left pads
    slots, cache, seen = torch.cat([mask, torch.ones(3, 9).long()], 1), model.new_cache(16, static=static), []
    for block in model.decoder.blocks:  # each FFN and its input (B, T, D)
        block.ffn.register_forward_pre_hook(lambda ffn, args: seen.append((ffn, args[0])))
    for new, keys, keep in [(ids, mask, mask), (ids[:, :1], slots[:, :8], slots[:, 7:8])]:
        seen.clear()
        got = _losses(model, new, slots if static else keys, cache=cache)
        alone = [_losses(ffn, h[keep.bool()][None]) for ffn, h in list(seen)]
        for name in ("moe_aux_loss", "moe_z_loss"):
            torch.testing.assert_close(got[name], sum(layer[name] for layer in alone))


def test_the_model_sums_each_loss_over_its_layers():
    model = tiny_model(ffn="moe", n_layers=3)
    total = _losses(model, torch.randint(0, 61, (2, 9)))
    per_layer = [block.ffn.aux_losses() for block in model.decoder.blocks]
    assert set(total) == {"moe_aux_loss", "moe_z_loss"}
    for name, value in total.items():
        torch.testing.assert_close(value, sum(layer[name] for layer in per_layer))
    assert tiny_model(ffn="swiglu").aux_losses() == {}


# ---- a decoder with ffn=moe ----------------------------------------------------------------------
def test_changing_a_future_token_leaves_past_logits_unchanged():
    model = tiny_model(ffn="moe", moe_top_k=2, moe_shared_expert=True)
    x = torch.randint(0, 61, (1, 10))
    y = x.clone()
    y[0, 6] = (y[0, 6] + 1) % 61
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("renormalize", [True, False])
def test_cached_decoding_gives_the_tokens_of_full_recompute(renormalize):
    model = tiny_model(ffn="moe", n_kv_heads=2, tie_embeddings=False, moe_renormalize=renormalize)
    prompt = torch.randint(0, 61, (3, 6))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    uncached = model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False)
    assert cached[:, -12:].unique().numel() > 2  # not one token repeated: the comparison can fail
    assert torch.equal(cached, uncached)


def test_a_tiny_model_learns_and_the_router_learns_from_its_losses_alone():
    model = zoo.build_model(tiny_config(ffn="moe", n_experts=4, moe_aux_loss_coef=0.1, moe_z_loss_coef=0.01), seed=0)
    model.train()
    x = torch.randint(0, 61, (4, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 61), x[:, 1:].reshape(-1))
        losses.append(loss.item())
        (loss + sum(model.aux_losses().values())).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert losses[-1] < 0.5 * losses[0]
    model(x)
    sum(model.aux_losses().values()).backward()  # the auxiliary losses alone
    for block in model.decoder.blocks:
        assert block.ffn.router.weight.grad.abs().sum() > 0
    last = model.decoder.blocks[-1].ffn  # its losses read its router and what earlier layers computed
    assert last.experts.fc.weight.grad is None


@pytest.mark.slow
def test_zoo_train_logs_the_routers_losses(tmp_path):
    from test_tasks import compose_train

    from tasks.cli.train.training import train

    train(
        compose_train(
            "gpt_generator", tmp_path, "model/ffn=moe", "model.n_experts=4", "trainer.max_steps=3", "test=false"
        )
    )
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    for stage in ("train", "val"):
        logged = [float(row[f"{stage}/moe_aux_loss"]) for row in rows if row.get(f"{stage}/moe_aux_loss")]
        assert logged and all(0.0 < value < 1.0 for value in logged)  # 0.01 x ~1 per layer, two layers
        assert any(row.get(f"{stage}/moe_z_loss") for row in rows)


# ---- init, save, adapters ------------------------------------------------------------------------
def test_init_weights_redraws_the_stacked_experts():
    model = tiny_model(ffn="moe", n_layers=4, d_model=64, d_ff=128, init_std=0.5, moe_shared_expert=True)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    model.init_weights()
    for block in model.decoder.blocks:
        ffn = block.ffn
        assert ffn.experts.fc.weight.std().item() == pytest.approx(0.5, rel=0.05)
        assert ffn.experts.fc.weight.mean().abs().item() < 0.02
        scaled = 0.5 / math.sqrt(2 * 4)  # the residual projections, as for a dense FFN (GPT-2)
        assert ffn.experts.proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
        assert ffn.shared.proj.weight.std().item() == pytest.approx(scaled, rel=0.1)
        assert ffn.router.weight.std().item() == pytest.approx(0.5, rel=0.2)


def test_deepnorm_scales_the_expert_weights_and_not_the_router():
    sizes = dict(ffn="moe", n_layers=3, init_std=0.5, moe_shared_expert=True)
    deep, post = tiny_model(norm_placement="deepnorm", **sizes), tiny_model(norm_placement="post", **sizes)
    beta = deep.decoder.blocks[0].ffn_res.beta
    assert beta != 1.0
    for d, p in zip(deep.decoder.blocks, post.decoder.blocks, strict=True):
        torch.testing.assert_close(d.ffn.router.weight, p.ffn.router.weight, rtol=0, atol=0)
        torch.testing.assert_close(d.ffn.experts.fc.weight, beta * p.ffn.experts.fc.weight)
        torch.testing.assert_close(d.ffn.shared.fc.weight, beta * p.ffn.shared.fc.weight)


def test_a_saved_model_loads_back_equal(tmp_path):
    model = tiny_model(ffn="moe", moe_top_k=1, moe_shared_expert=True, moe_renormalize=False)
    zoo.save_pretrained(model, tmp_path)
    loaded = zoo.load_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    x = torch.randint(0, 61, (2, 6))
    torch.testing.assert_close(loaded(x), model(x))


def test_lora_adapts_attention_and_leaves_the_experts_frozen():
    model = zoo.adapters.apply(tiny_model(ffn="moe"), rank=2, targets=("q", "v"))
    trainable = zoo.adapters.trainable_parameters(model)
    assert trainable and all(".lora_" in name for name in trainable)
    with pytest.raises(zoo.ConfigError, match="'ffn' selects no layer") as error:
        zoo.adapters.apply(tiny_model(ffn="moe", moe_shared_expert=True), targets=("ffn",))
    message, targets, extra = str(error.value), (r".*ffn\.router", r".*ffn\.shared\.(fc|proj)"), (r".*ffn\.experts",)
    assert "\n" not in message and all(f"'{p}'" in message for p in targets + extra)  # and what it names works:
    model = zoo.adapters.apply(tiny_model(ffn="moe", moe_shared_expert=True), targets=targets, trainable=extra)
    names = {name.split(".ffn.")[1].split(".lora_")[0] for name in zoo.adapters.trainable_parameters(model)}
    assert names == {"router", "shared.fc", "shared.proj", "experts.fc.weight", "experts.proj.weight"}


# ---- counting ------------------------------------------------------------------------------------
def test_stats_count_total_and_active_parameters(monkeypatch):
    cfg = tiny_config(ffn="moe", n_experts=8, moe_top_k=2, n_layers=3)
    s = zoo.stats(cfg)
    per_expert = 3 * 32 * 48  # gate, up and down of width 48
    assert s.params - s.active_params == 3 * (8 - 2) * per_expert
    dense = zoo.stats(tiny_config(ffn="swiglu"))
    assert dense.active_params == dense.params
    shared = zoo.stats(cfg.replace(moe_shared_expert=True))
    assert shared.active_params - s.active_params == shared.params - s.params == 3 * per_expert
    monkeypatch.setattr(zoo.ffn.SwiGLU, "inactive_parameters", lambda self: 7)  # stats asks every sublayer
    assert zoo.stats(tiny_config(ffn="swiglu")).active_params == dense.params - 2 * 7


def test_forward_flops_are_those_of_the_active_parameters():
    cfg = tiny_config(ffn="moe", d_model=64, d_ff=256, vocab_size=512, n_layers=3, attention="math", n_experts=8)
    model = zoo.build_model(cfg)
    T = 32
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 512, (2, T)))
    counted = counter.get_total_flops() / (2 * T)
    s = zoo.stats(cfg, seq_len=T)
    assert counted == pytest.approx(s.flops_per_token_forward, rel=0.01)
    assert s.flops_per_token_forward < zoo.stats(cfg.replace(moe_top_k=8), seq_len=T).flops_per_token_forward


def test_zoo_info_shows_active_parameters_for_a_mixture_of_experts(capsys):
    MODELS.register("moe-test")(lambda: tiny_config(ffn="moe", n_experts=8, moe_top_k=2))
    try:
        info_main(["moe-test", "--json"])
        (row,) = json.loads(capsys.readouterr().out)
        assert row["active_params"] == zoo.stats("moe-test").active_params < row["params"]
        info_main(["moe-test"])
        assert "active" in capsys.readouterr().out
        info_main(["gpt-tiny"])
        assert "active" not in capsys.readouterr().out  # a dense table is as before
    finally:
        MODELS.unregister("moe-test")


# ---- composition ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(ffn="moe", n_experts=4, moe_top_k=5), r"^moe_top_k=5 exceeds n_experts=4: .*set moe_top_k <= 4"),
        (dict(ffn="moe", moe_aux_loss_coef=-0.1), r"^moe_aux_loss_coef=-0.1 must be >= 0"),
        (dict(ffn="moe", moe_z_loss_coef=float("nan")), r"^moe_z_loss_coef=nan must be >= 0"),
        (dict(ffn="moe", n_experts=0), r"^n_experts=0 must be a positive integer"),
        (dict(ffn="swiglu", n_experts=4), r"^n_experts=4 is read by ffn=moe only; ffn=swiglu ignores it"),
        (dict(ffn="gelu", moe_shared_expert=True), r"^moe_shared_expert=True is read by ffn=moe only"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(overrides, message):
    with pytest.raises(zoo.ConfigError, match=message) as error:
        tiny_config(**overrides).validate()
    assert "\n" not in str(error.value)


def test_the_config_group_chooses_it_and_d_ff_resolves_as_for_swiglu():
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["model/ffn=moe", "model.n_experts=4", "model.moe_top_k=1"])
    model = model_config(cfg.model).validate()
    assert (model.ffn, model.n_experts, model.moe_top_k) == ("moe", 4, 1)
    assert zoo.ModelConfig(ffn="moe", d_model=4096).resolved_d_ff == 11008


def test_no_export_format_claims_a_mixture_of_experts_it_cannot_compute():
    cfg = zoo.get_config("llama-tiny", ffn="moe", moe_shared_expert=True)
    for exportable in (zoo.hf_exportable, zoo.gguf_exportable):
        with pytest.raises(zoo.ConfigError) as error:
            exportable(cfg)
        assert "\n" not in str(error.value)

"""The GPU path: bf16, the fused SDPA kernels, torch.compile, cached generation. Skipped without CUDA."""

import pytest
import torch
import torch.nn.functional as F

import zoo

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

POSITIONS = zoo.list_components()["position"]


@pytest.mark.parametrize("position", POSITIONS)
def test_bf16_sdpa_matches_the_math_path(position):
    with torch.device("cuda"):
        sdpa = zoo.create_model("llama-tiny", position=position, seed=0).eval()
        math = zoo.create_model("llama-tiny", position=position, seed=0, attention="math").eval()
    x = torch.randint(0, 1024, (4, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = sdpa(x).float(), math(x).float()
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_flash_kernel_runs_for_plain_causal_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.device("cuda"):
        model = zoo.create_model("gpt-tiny", seed=0, n_heads=2).to(torch.bfloat16)  # head_dim 64
    x = torch.randint(0, 1024, (2, 256), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if the flash kernel cannot take the call
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
    assert torch.isfinite(loss)


def test_compiled_model_matches_eager_and_keeps_parameter_names():
    with torch.device("cuda"):
        model = zoo.create_model("llama-tiny", seed=0).eval()
    names = [n for n, _ in model.named_parameters()]
    x = torch.randint(0, 1024, (2, 64), device="cuda")
    eager = model(x)
    model.compile()
    torch.testing.assert_close(model(x), eager, atol=1e-3, rtol=1e-3)
    assert [n for n, _ in model.named_parameters()] == names


def test_cached_generation_on_gpu_equals_cpu():
    cpu = zoo.create_model("llama-tiny", seed=0, init_std=0.1).eval()
    gpu = zoo.create_model("llama-tiny", seed=0, init_std=0.1).eval().cuda()
    prompt = torch.randint(0, 1024, (2, 8))
    a = cpu.generate(prompt, 16, eos_token_id=None)
    b = gpu.generate(prompt.cuda(), 16, eos_token_id=None).cpu()
    assert torch.equal(a, b)


def test_bf16_mixed_training_step_with_fused_adamw():
    with torch.device("cuda"):
        model = zoo.create_model("gpt-tiny", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, 1024, (8, 129), device="cuda")
    losses = []
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]

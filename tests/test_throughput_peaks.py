"""MFU needs the device's dense peak: zoo's table finds H100 and H200 by the names torch.cuda.get_device_name
gives them (Lightning's has no 'NVIDIA H200'), and the Throughput callback asks it before Lightning's. All on
the CPU: the lookup goes by name, and the callback's device is faked."""

from types import SimpleNamespace

import pytest
import torch

from tasks.run.callbacks import Throughput
from zoo.stats import peak_flops

SXM, NVL, PCIE = 989.4e12, 835.5e12, 756e12  # dense bf16, NVIDIA's datasheets (their sparse figures are twice these)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", SXM),
        ("NVIDIA H200 NVL", NVL),
        ("NVIDIA GH200 480GB", SXM),
        ("NVIDIA H100 80GB HBM3", SXM),
        ("NVIDIA H100 SXM5 94GB", SXM),
        ("NVIDIA H100 PCIe", PCIE),
        ("NVIDIA H100 NVL", NVL),
    ],
)
def test_hopper_gpus_are_found_by_their_device_names(name, peak):
    assert peak_flops(name, torch.bfloat16) == peak
    assert peak_flops(name, torch.float16) == peak
    assert peak_flops(name, "tf32") == pytest.approx(
        peak / 2, rel=1e-3
    )  # float32 matmuls on tensor cores: half the bf16 rate
    assert peak_flops(name, torch.float8_e4m3fn) == pytest.approx(2 * peak, rel=1e-3)
    assert peak_flops(name, torch.float32) < peak / 10  # no tensor cores


def test_an_unknown_device_or_dtype_has_no_peak():
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) is None  # not in zoo's table: Lightning's has it
    assert peak_flops("cpu", torch.float32) is None
    assert peak_flops("NVIDIA H200", torch.int64) is None


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16-mixed", torch.bfloat16), ("bf16-true", torch.bfloat16), ("16-mixed", torch.float16), ("32-true", "tf32")],
)
def test_the_callback_reads_the_table_for_the_trainers_precision(monkeypatch, precision, dtype):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 allowed: a float32 run's matmuls use tensor cores
    try:
        trainer = SimpleNamespace(
            strategy=SimpleNamespace(root_device=torch.device("cuda", 0)), precision=precision, global_step=0
        )
        callback = Throughput()
        callback.on_train_start(trainer, None)
    finally:
        torch.set_float32_matmul_precision(before)
    assert callback.peak_flops == peak_flops("NVIDIA H200", dtype)
    assert callback.peak_flops == pytest.approx(SXM / 2 if dtype == "tf32" else SXM, rel=1e-3)


def test_a_given_peak_is_kept_and_a_cpu_gets_none():
    cpu = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), precision="32-true", global_step=0)
    callback = Throughput()
    callback.on_train_start(cpu, None)
    assert callback.peak_flops is None
    given = Throughput(peak_flops=1e12)
    given.on_train_start(
        SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)), global_step=0), None
    )
    assert given.peak_flops == 1e12

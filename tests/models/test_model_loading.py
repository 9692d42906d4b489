"""``model.dtype``: explicit values as given; ``auto`` picks bfloat16 where the device
multiplies it natively (a GPU that supports it, a CPU with AMX, AVX512-BF16 or Arm BF16) and
float32 elsewhere, and the run log says which and why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from mappa.models import loading
from mappa.models.loading import auto_dtype_reason, cpu_bf16_instructions, resolve_dtype

CPU = torch.device("cpu")


def _probes(monkeypatch: pytest.MonkeyPatch, *, amx: bool, avx512_bf16: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_taken_as_given(name: str) -> None:
    assert resolve_dtype(name, CPU) == getattr(torch, name)


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "features", "found"),
    [
        (True, True, "", "AMX"),
        (False, True, "", "AVX512-BF16"),
        (False, False, "Features\t: fp asimd bf16 i8mm sve\n", "BF16"),  # aarch64
        (False, False, "Features\t: fp asimd sve\n", None),
        (False, False, "flags\t\t: fpu avx2 avx512f\n", None),  # x86 without bf16
    ],
)
def test_auto_picks_bfloat16_on_a_cpu_with_bfloat16_instructions(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    amx: bool,
    avx512_bf16: bool,
    features: str,
    found: str | None,
) -> None:
    _probes(monkeypatch, amx=amx, avx512_bf16=avx512_bf16)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(features)
    assert cpu_bf16_instructions(cpuinfo) == found
    monkeypatch.setattr(loading, "cpu_bf16_instructions", lambda: found)
    assert resolve_dtype("auto", CPU) == (torch.bfloat16 if found else torch.float32)
    picked, why = auto_dtype_reason(CPU)
    assert picked == (found is not None)
    assert (found or "no bfloat16 instructions") in why


def test_a_cpu_without_a_readable_cpuinfo_has_no_arm_bf16(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _probes(monkeypatch, amx=False, avx512_bf16=False)
    assert cpu_bf16_instructions(tmp_path / "missing") is None


def test_the_run_log_says_which_dtype_auto_picked_and_why(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loading, "cpu_bf16_instructions", lambda: "AVX512-BF16")
    with caplog.at_level(logging.INFO, logger="mappa.models.loading"):
        model, _ = loading.load_base(str(tiny_model_dir), "auto", "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert "model.dtype auto: torch.bfloat16 on cpu (the CPU has AVX512-BF16 instructions)" in (
        caplog.text
    )

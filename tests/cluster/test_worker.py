"""``mappa.cluster.worker`` without Ray or a model: what a trainer actor hands the driver.

No GPU here: a trainer's GPU tensors are played by ``FakeCudaTensor`` (CPU data that
reports ``cuda:0``), and the device the state is restored onto by torch's ``meta`` device.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.utils._pytree import tree_map

from mappa.cluster.worker import PolicyWorker, to_cpu


class FakeCudaTensor(torch.Tensor):
    """A fake GPU tensor: reports device ``cuda:0`` while its data (``inner``) is on CPU.
    Every op runs on the data and stays fake, except a copy to CPU, which gives the data as
    a plain CPU tensor: what a real GPU tensor does, without a GPU."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> FakeCudaTensor:
        fake = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, data.shape, dtype=data.dtype, device=torch.device("cuda", 0)
        )
        fake.inner = data
        return fake  # type: ignore[no-any-return]

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FakeCudaTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        unwrap = lambda x: x.inner if isinstance(x, FakeCudaTensor) else x  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        device = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and torch.device(device or "cuda").type == "cpu":
            return out
        return tree_map(lambda x: cls(x) if isinstance(x, torch.Tensor) else x, out)


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested state dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _stepped_adam(param: torch.nn.Parameter) -> torch.optim.Adam:
    """An Adam over ``param`` after one step: it has moments and a ``step``."""
    optimizer = torch.optim.Adam([param], lr=0.1)
    (param**2).sum().backward()
    optimizer.step()
    return optimizer


def _trainer(optimizer: torch.optim.Adam) -> PolicyWorker:
    """A ``PolicyWorker`` with only a trainer's optimizer (agent ``solver``), no model."""
    worker = PolicyWorker.__new__(PolicyWorker)
    worker.optimizers = {"solver": optimizer}
    return worker


def test_fake_cuda_tensor_copies_to_cpu_as_a_gpu_tensor_does() -> None:
    fake = FakeCudaTensor(torch.arange(3.0))
    assert fake.device == torch.device("cuda", 0) and fake.is_cuda
    assert type(fake.detach()) is FakeCudaTensor
    cpu = fake.to("cpu")
    assert type(cpu) is torch.Tensor and cpu.device.type == "cpu"
    assert torch.equal(cpu, torch.arange(3.0))


def test_optimizer_state_of_a_gpu_trainer_reaches_the_driver_on_cpu() -> None:
    param = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = _stepped_adam(param)
    live = optimizer.state[param]
    moments = {k: v.clone() for k, v in live.items()}
    for key in list(live):  # the trainer's GPU: the moments, and step (as fused Adam has it)
        live[key] = FakeCudaTensor(live[key])

    state = _trainer(optimizer).optimizer_state("solver")

    tensors = _tensors(state)
    assert tensors and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors)
    saved = state["state"][0]
    assert set(saved) == {"step", "exp_avg", "exp_avg_sq"}
    for key, value in moments.items():  # ``step`` stays a tensor, 0-dim
        assert torch.equal(saved[key], value) and saved[key].shape == value.shape, key
    assert state["param_groups"] == optimizer.state_dict()["param_groups"]  # as they were
    buf = io.BytesIO()  # the checkpoint: saved by the driver, read with weights_only
    torch.save(state, buf)
    buf.seek(0)
    assert torch.equal(
        torch.load(buf, weights_only=True)["state"][0]["exp_avg"], moments["exp_avg"]
    )


def test_the_cpu_state_is_restored_onto_the_trainers_device_and_dtype() -> None:
    state = _trainer(_stepped_adam(torch.nn.Parameter(torch.randn(4, 3)))).optimizer_state("solver")
    on_device = torch.nn.Parameter(torch.empty(4, 3, device="meta", dtype=torch.bfloat16))
    optimizer = torch.optim.Adam([on_device], lr=0.1)

    _trainer(optimizer).load_optimizer_state("solver", state)

    restored = optimizer.state[on_device]
    for key in ("exp_avg", "exp_avg_sq"):  # Optimizer.load_state_dict casts to the param
        assert restored[key].device.type == "meta" and restored[key].dtype == torch.bfloat16
    # non-fused Adam keeps ``step`` a CPU float tensor, as it makes it itself
    assert restored["step"].device.type == "cpu" and restored["step"].item() == 1


def test_to_cpu_copies_nested_tensors_and_keeps_the_rest() -> None:
    live = torch.ones(2)
    value = {"a": [live, (FakeCudaTensor(torch.zeros(1)), 3)], "b": "x", "c": None}
    out = to_cpu(value)
    assert out["b"] == "x" and out["c"] is None and out["a"][1][1] == 3
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in _tensors(out))
    out["a"][0].add_(1)  # a copy: the worker's live tensors are not handed out
    assert torch.equal(live, torch.ones(2))

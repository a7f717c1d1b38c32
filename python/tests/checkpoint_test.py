"""dtensor.checkpoint (DCP's save/load over checkpoint/checkpoint.h) against uninterrupted runs and
the global tensors: resuming training from a checkpoint, resharding on load (another number of
ranks, other placements, plain tensors in one process), the files' format read by an independent
reader, nested state dicts, and errors. Ranks are threads (dtensor.run_threads)."""

import copy
import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtensor
from dtensor import DTensor, Shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def _steps(model, opt, x, n):
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _init_adam_state(model, opt):
    """Creates Adam's state (empty until a first step) so that load has tensors to fill, as DCP's
    get_optimizer_state_dict does: one step with zero gradients leaves the parameters unchanged,
    and every state value is overwritten by load."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()


def test_resume_training_matches_uninterrupted_run(tmp_path):
    torch.manual_seed(0)
    ref, x = MLP(), torch.randn(4, 8)
    other = MLP()  # a different initialization for the resumed run
    ckpt = str(tmp_path / "ckpt")
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (4,))
        model = parallelize_module(copy.deepcopy(ref), mesh, plan)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        _steps(model, opt, x, 3)
        dtensor.checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 3},
                                checkpoint_id=ckpt)
        uninterrupted = _steps(model, opt, x, 3)

        fresh = parallelize_module(copy.deepcopy(other), mesh, plan)
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
        _init_adam_state(fresh, fresh_opt)
        params = list(fresh.parameters())
        state = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict(), "step": 0}
        dtensor.checkpoint.load(state, checkpoint_id=ckpt)
        assert state["step"] == 3
        # Loaded in place: the parameters are the same objects, now holding the saved values.
        assert all(a is b for a, b in zip(params, fresh.parameters()))
        assert all(isinstance(p, DTensor) for p in fresh.parameters())
        assert state["optim"]["param_groups"] == opt.state_dict()["param_groups"]
        # As with DCP, the loaded dicts go through load_state_dict (the optimizer's deep-copies
        # the distributed state: Tensor.__deepcopy__ of dtensor/_api.py).
        fresh.load_state_dict(state["model"])
        fresh_opt.load_state_dict(state["optim"])
        assert all(isinstance(v, DTensor) for s in fresh_opt.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0)
        resumed = _steps(fresh, fresh_opt, x, 3)
        return uninterrupted, resumed

    for uninterrupted, resumed in dtensor.run_threads(4, rank_fn):
        torch.testing.assert_close(torch.tensor(resumed), torch.tensor(uninterrupted),
                                   rtol=0, atol=1e-6)


def _values():
    return {"int": 7, "float": 0.25, "str": "llama", "cfg": {"betas": (0.9, 0.99), "on": True}}


def test_reshard_on_load_other_ranks_placements_and_one_process(tmp_path):
    torch.manual_seed(0)
    w, b = torch.randn(10, 6), torch.randn(5)  # 10 rows on 4 ranks: uneven pieces
    ckpt = str(tmp_path / "ckpt")

    def save_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (4,))
        dtensor.checkpoint.save({"w": dtensor.distribute_tensor(w, mesh, [Shard(0)]),
                                 "b": b.clone(), **_values()}, checkpoint_id=ckpt)

    dtensor.run_threads(4, save_fn)

    def load_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        dw = dtensor.distribute_tensor(torch.zeros(10, 6), mesh, [Shard(1)])
        state = {"w": dw, "b": torch.zeros(5), "int": 0, "float": 0.0, "str": "",
                 "cfg": {"betas": (0.0, 0.0), "on": False}}
        dtensor.checkpoint.load(state, checkpoint_id=ckpt)
        assert state["w"] is dw and dw.placements == (Shard(1),)
        return dw.full_tensor(), state

    for full, state in dtensor.run_threads(2, load_fn):
        assert torch.equal(full, w) and torch.equal(state["b"], b)
        assert {k: v for k, v in state.items() if k not in ("w", "b")} == _values()

    # One process, no rank context: plain tensors receive the global tensors.
    state = {"w": torch.zeros(10, 6), "b": torch.zeros(5), "int": 0, "float": 0.0, "str": "",
             "cfg": {"betas": (0.0, 0.0), "on": False}}
    dtensor.checkpoint.load(state, checkpoint_id=ckpt)
    assert torch.equal(state["w"], w) and torch.equal(state["b"], b)
    assert type(state["cfg"]["betas"]) is tuple
    assert {k: v for k, v in state.items() if k not in ("w", "b")} == _values()


def _read_safetensors(path):
    """The file read by the safetensors package (PyPI's, Hugging Face's reader): the format's
    reference implementation, independent of the engine's writer."""
    from safetensors.torch import load_file

    return load_file(str(path))


def test_one_process_checkpoint_is_a_plain_safetensors_file(tmp_path):
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(3, 4), "idx": torch.arange(6).reshape(2, 3)},
             "scale": torch.randn(2, dtype=torch.float64)}
    ckpt = tmp_path / "ckpt"
    dtensor.checkpoint.save(state, checkpoint_id=ckpt)
    got = _read_safetensors(ckpt / "model.safetensors")
    assert sorted(got) == ["model.idx", "model.w", "scale"]
    assert torch.equal(got["model.w"], state["model"]["w"])
    assert torch.equal(got["model.idx"], state["model"]["idx"])
    assert torch.equal(got["scale"], state["scale"])


def test_nested_state_dict_round_trip(tmp_path):
    torch.manual_seed(0)
    t, u = torch.randn(3), torch.randn(2, 2)
    saved = {"optim": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": t.clone()}},
                       "param_groups": [{"params": [0], "lr": 0.1, "betas": (0.9, 0.999),
                                         "amsgrad": False, "foreach": None}]},
             "mixed": [u.clone(), 5, "x"], "step": 3}
    dtensor.checkpoint.save(saved, checkpoint_id=tmp_path / "ckpt")
    index = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())
    assert sorted(index["tensors"]) == ["mixed.0", "optim.state.0.exp_avg", "optim.state.0.step"]
    assert sorted(index["values"]) == ["mixed.1", "mixed.2", "optim.param_groups", "step"]

    state = {"optim": {"state": {0: {"step": torch.tensor(0.0), "exp_avg": torch.zeros(3)}},
                       "param_groups": [{"params": [0], "lr": 1.0, "betas": (0.0, 0.0),
                                         "amsgrad": True, "foreach": True}]},
             "mixed": [torch.zeros(2, 2), 0, ""], "step": 0}
    exp_avg = state["optim"]["state"][0]["exp_avg"]
    dtensor.checkpoint.load(state, checkpoint_id=tmp_path / "ckpt")
    assert state["optim"]["state"][0]["exp_avg"] is exp_avg and torch.equal(exp_avg, t)
    assert torch.equal(state["mixed"][0], u) and state["mixed"][1:] == [5, "x"]
    assert state["optim"]["param_groups"] == saved["optim"]["param_groups"]
    assert state["step"] == 3


def test_errors_name_the_key(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    dtensor.checkpoint.save({"model": {"w": torch.ones(4, 2)}}, checkpoint_id=ckpt)
    with pytest.raises(RuntimeError, match="model.bias"):
        dtensor.checkpoint.load({"model": {"w": torch.zeros(4, 2), "bias": torch.zeros(2)}},
                                checkpoint_id=ckpt)
    with pytest.raises(RuntimeError, match="model.w"):
        dtensor.checkpoint.load({"model": {"w": torch.zeros(4, 3)}}, checkpoint_id=ckpt)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        dw = dtensor.distribute_tensor(torch.zeros(5, 2), mesh, [Shard(0)])
        with pytest.raises(RuntimeError, match="model.w"):
            dtensor.checkpoint.load({"model": {"w": dw}}, checkpoint_id=ckpt)
        return True

    assert all(dtensor.run_threads(2, rank_fn))
    with pytest.raises(TypeError, match="model.obj"):
        dtensor.checkpoint.save({"model": {"obj": object()}}, checkpoint_id=ckpt)
    assert os.path.exists(os.path.join(ckpt, "model.safetensors"))  # the failed save left it

"""The test-only shims that let Megatron-Core's real training stack run on CPU ranks over gloo.

Megatron-Core (0.16.x and 0.19.2) allocates on ``torch.cuda.current_device()``, waits on CUDA streams and
whitelists ``torch.cuda.*`` tensor types (four shims, every version); its checkpoints synchronize the device and,
without Apex/TE, mishandle torch Adam's 'step' on load and, on 0.16 / 0.17's layer-wise optimizer, on save (three
shims, checkpoints only); 0.16 also has two import-time
gaps when Transformer Engine is absent (two more, 0.16 only); from 0.18 the DDP wrap Megatron-Bridge's model setup
calls builds DDP in a CUDA side stream (one more, that wrap only). Each shim answers exactly one of those as a CPU (or
TE's FusedAdam) would, and records the Megatron call sites that hit it. `tests/megatron_cpu/test_shims.py` runs
without each shim (it must fail as documented: the shim is still needed) and with all of them (they are still
enough, and each is hit at its documented call site), so a Megatron-Core version bump that changes either is
visible. RNG needs no shim: ``model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)`` keeps the CUDA
RNG tracker out.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch


@dataclass
class Shim:
    """One replaced CUDA call: what, where Megatron calls it, why."""

    name: str
    replaces: str
    call_sites: tuple[str, ...]
    """Megatron files (relative to site-packages) that must hit this shim in a training step on both versions."""
    why: str
    failure: str
    """A regex of the error a training step raises without this shim."""
    hits: collections.Counter = field(default_factory=collections.Counter)
    """Call site 'megatron/...py:line (function)' -> count, filled while the shim is installed."""

    def record(self) -> None:
        self.hits[_megatron_caller()] += 1


SHIMS: dict[str, Shim] = {s.name: s for s in (
    Shim("current_device", "torch.cuda.current_device() -> 'cpu'",
         ("megatron/core/distributed/param_and_grad_buffer.py",),
         "buffers and scalars are allocated with device=torch.cuda.current_device(); without a driver this raises",
         r"(?i)nvidia driver|cuda|not compiled"),
    Shim("current_stream", "torch.cuda.current_stream() -> a no-op stream",
         ("megatron/core/distributed/param_and_grad_buffer.py",),
         "the DDP bucket group waits on torch.cuda.current_stream() before every gradient reduction",
         r"(?i)nvidia driver|cuda|not compiled"),
    Shim("cuda_device_to_cpu", "device='cuda' / .cuda() / .to('cuda') -> CPU (a TorchFunctionMode)",
         ("megatron/core/optimizer/clip_grads.py",),
         "optimizer, grad clipping and schedules build tensors with a hard-coded device='cuda'",
         r"(?i)nvidia driver|cuda|not compiled"),
    Shim("cuda_tensor_type", "Tensor.type() of a CPU tensor reports 'torch.cuda.<Type>' (same TorchFunctionMode)",
         ("megatron/core/optimizer/distrib_optimizer.py",),
         "DistributedOptimizer (and Float16OptimizerWithFloat16Params, optimizer.py, on the layer-wise path) accept "
         "only torch.cuda.* parameter types",
         r"(?i)wrapped parameters must be one of|torch\.cuda\.(Float|BFloat16|Half)Tensor"),
    Shim("cuda_synchronize", "torch.cuda.synchronize() -> no-op",
         ("megatron/core/dist_checkpointing/strategies/filesystem_async.py",),
         "dist_checkpointing's torch_dist writer synchronizes the device before copying tensors to the host "
         "(checkpoint save only)", r"(?i)nvidia driver|cuda|not compiled"),
    Shim("adam_step_for_load", "torch Adam's 'step' around a checkpoint load: 0 while state_dict() of a fresh optimizer "
         "reads it, hidden while _set_main_param_and_optimizer_states copies the loaded tensors, one tensor per "
         "state after load_state_dict",
         ("megatron/core/optimizer/distrib_optimizer.py",),
         "without Apex/TE, state_dict() reads every torch Adam state's 'step' and asserts there is exactly one value "
         "(distrib_optimizer.py:839); loading a checkpoint into a fresh optimizer calls it before any step exists "
         "(TE's FusedAdam reports None there); then load_state_dict puts the loaded step into every state, but the "
         "per-parameter tensors read back carry none and the copy (line 1223) raises KeyError: 'step'; and that step "
         "is one tensor shared by every state, which torch's Adam increments in place once per parameter",
         r"AssertionError|KeyError: 'step'"),
    Shim("adam_common_step", "torch Adam's step in a layer-wise checkpoint: a rank without Adam parameters saves "
         "the step of a rank that has them (0.16 / 0.17 only)", ("megatron/core/optimizer/optimizer.py",),
         "Float16OptimizerWithFloat16Params.sharded_state_dict saves torch Adam's per-parameter step as the common "
         "state's 'common_step' (optimizer.py:846), which only rank 0 writes; where rank 0 holds no Adam parameter "
         "there is none, and the other ranks load Adam states without 'step' (TE's "
         "FusedAdam keeps it in the param groups, which the layer-wise sharded_state_dict takes from a rank that "
         "holds parameters); measured: a layer-wise Muon checkpoint of tiny Kimi K2 at DP=4 (the NS-cost "
         "assignment leaves rank 0 matrices only)", r"KeyError: 'step'"),
    Shim("mla_have_te_flag", "multi_latent_attention.HAVE_TE -> False when its TELinear is not a class (0.16 only)",
         ("megatron/core/transformer/multi_latent_attention.py",),
         "0.16 sets HAVE_TE=True whenever megatron.core.extensions.transformer_engine imports, which it does "
         "without TE (its TE names are MagicMock placeholders), then calls isinstance(linear_proj, TELinear) in "
         "MLASelfAttention.__init__",
         r"isinstance\(\) arg 2 must be a type"),
    Shim("moe_te_general_gemm_name", "moe_utils.te_general_gemm defined as None where the module never defines it "
         "(0.16 only)", ("megatron/core/transformer/moe/moe_utils.py",),
         "0.16's RouterGatingLinearFunction.forward (moe_router_dtype='fp32', Kimi K2's router) reads the module "
         "global te_general_gemm, which is only assigned when TE imports", r"name 'te_general_gemm' is not defined"),
    Shim("gloo_uneven_all_gather", "torch.distributed.all_gather of unequal sizes over gloo -> padded to the largest, "
         "also asynchronous (0.16 / 0.17)", ("megatron/core/optimizer/layer_wise_optimizer.py",),
         "0.16 / 0.17's LayerWiseDistributedOptimizer.allgather_params (Megatron's wiring, the default) and nemo-muon's "
         "gather in the next forward (owner_gather, optimizer.collectives=reduce_scatter) gather each rank's "
         "flattened matrices, of unequal sizes; NCCL accepts unequal sizes, gloo does not", r"invalid tensor size"),
    Shim("cuda_side_stream", "torch.cuda.Stream() -> a no-op stream, torch.cuda.stream(s) -> a null context "
         "(Megatron's DDP wrap only)", ("megatron/training/models/dist_utils.py",),
         "megatron.training's _ddp_wrap (Bridge 0.5 / 0.6's model setup) builds DDP inside a new CUDA side stream",
         r"(?i)nvidia driver|cuda|not compiled"),
)}
CHECKPOINT_ONLY: frozenset[str] = frozenset({"cuda_synchronize", "adam_step_for_load", "adam_common_step"})
"""Shims only a checkpoint save (cuda_synchronize, adam_common_step) or load (adam_step_for_load) reaches."""
LAYER_WISE_ONLY: frozenset[str] = frozenset({"gloo_uneven_all_gather"})
"""Shims only the layer-wise (Muon) optimizer reaches."""
DDP_WRAP_ONLY: frozenset[str] = frozenset({"cuda_side_stream"})
"""Shims only Megatron-Core's ``megatron.training.models.dist_utils._ddp_wrap`` (Bridge's model setup) reaches; the
harness's own training step wraps DDP directly and never does (`test_shims.py` drives ``_ddp_wrap`` for these)."""
NEEDED_ON: dict[str, tuple[str, ...]] = {
    "current_stream": ("0.19",),  # 0.16's bucket group does not wait on the current stream
    "mla_have_te_flag": ("0.16",),
    "adam_common_step": ("0.16", "0.17"),  # 0.18+'s layer-wise optimizer: no rank without Adam's step at DP=4
    "moe_te_general_gemm_name": ("0.16",),
    "gloo_uneven_all_gather": ("0.16", "0.17"),  # 0.18+: the layer-wise optimizer gathers equal, padded shards
    "cuda_side_stream": ("0.18", "0.19"),  # 0.16's wheel has no megatron.training (no _ddp_wrap)
}
"""Shims only some Megatron-Core minor versions need; the others are needed on every supported version."""


def needed_on(name: str, mcore_version: str) -> bool:
    """Whether shim ``name`` is needed on Megatron-Core ``mcore_version`` ('0.16.0', '0.19.2')."""
    minor = ".".join(mcore_version.split(".")[:2])
    return name not in NEEDED_ON or minor in NEEDED_ON[name]


def _megatron_caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "megatron" + os.sep in name and os.sep + "tests" + os.sep not in name:
            rel = name.split("site-packages" + os.sep, 1)[-1]
            if "site-packages" + os.sep not in name and os.sep + "nemo_muon" + os.sep in name:  # our own caller
                rel = "nemo_muon" + os.sep + name.split(os.sep + "nemo_muon" + os.sep, 1)[1]
            return f"{rel}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


class _NoOpStream:
    """Stands in for a CUDA stream: CPU work is already ordered."""

    def wait_stream(self, *args: object, **kwargs: object) -> None: ...

    def wait_event(self, *args: object, **kwargs: object) -> None: ...

    def synchronize(self) -> None: ...

    def record_event(self, event: object = None) -> object:
        return event


def _is_cuda(device: object) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _device_mode(rewrite_device: bool, report_cuda_type: bool) -> torch.overrides.TorchFunctionMode:
    dev, typ = SHIMS["cuda_device_to_cpu"], SHIMS["cuda_tensor_type"]

    class CudaToCpu(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Callable, types: Iterable, args: tuple = (), kwargs: dict | None = None):
            kwargs = kwargs or {}
            if rewrite_device:
                if func is torch.Tensor.cuda:
                    dev.record()
                    return args[0]
                if _is_cuda(kwargs.get("device")):
                    dev.record()
                    kwargs = {**kwargs, "device": "cpu"}
                if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
                    dev.record()
                    args = (args[0], "cpu", *args[2:])
            if report_cuda_type and func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                if name.startswith("torch.") and not name.startswith("torch.cuda."):
                    typ.record()
                    return "torch.cuda." + name[len("torch."):]
                return name
            return func(*args, **kwargs)

    return CudaToCpu()


def _install_adam_common_step() -> None:
    """Float16OptimizerWithFloat16Params.sharded_state_dict: a rank without a torch Adam step (no Adam parameter of its
    own) takes the step of the first rank that has one, as TE's FusedAdam's group step reaches the common state."""
    import torch.distributed as dist
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    original = Float16OptimizerWithFloat16Params.sharded_state_dict

    def sharded_state_dict(self, *args, **kwargs):  # noqa: ANN001, ANN202 - Megatron's method
        sharded = original(self, *args, **kwargs)
        state = sharded["optimizer"]["state"]
        steps: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(steps, state.get("common_step"))  # every rank builds every sub-optimizer's dict
        step = next((s for s in steps if s is not None), None)
        if "common_step" not in state and step is not None:
            SHIMS["adam_common_step"].record()
            state["common_step"] = step
        return sharded

    Float16OptimizerWithFloat16Params.sharded_state_dict = sharded_state_dict


def install(without: Iterable[str] = ()) -> list[Shim]:
    """Install every shim except those named in ``without`` (in this process, for good); return those installed."""
    skip = set(without)
    unknown = skip - set(SHIMS)
    if unknown:
        raise ValueError(f"without must name shims of {tuple(SHIMS)}; got {sorted(unknown)}")
    if "current_device" not in skip:
        def current_device() -> str:
            SHIMS["current_device"].record()
            return "cpu"

        torch.cuda.current_device = current_device
    if "cuda_synchronize" not in skip:
        def synchronize(*args: object, **kwargs: object) -> None:
            SHIMS["cuda_synchronize"].record()

        torch.cuda.synchronize = synchronize
    if "adam_step_for_load" not in skip:
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        original_state_dict = DistributedOptimizer.state_dict

        def state_dict(self):  # noqa: ANN001, ANN202 - Megatron's method
            if self.optimizer.state:
                return original_state_dict(self)
            # a fresh optimizer: one placeholder state (a non-parameter key, dropped from what is returned) so the
            # step extraction finds the value 0, as TE's FusedAdam would report no step
            SHIMS["adam_step_for_load"].record()
            self.optimizer.state["nemo_muon_fresh"] = {"step": torch.tensor(0.0)}
            try:
                return original_state_dict(self)
            finally:
                del self.optimizer.state["nemo_muon_fresh"]

        original_set_states = DistributedOptimizer._set_main_param_and_optimizer_states

        def set_states(self, model_param, tensors):  # noqa: ANN001, ANN202 - Megatron's method
            # load_state_dict put the loaded 'step' into every torch Adam state, but the per-parameter tensors read
            # back from the checkpoint carry none (load_parameter_state_from_fs_model_space skips it)
            group_index, group_order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
            if "step" not in state or "step" in tensors:
                return original_set_states(self, model_param, tensors)
            SHIMS["adam_step_for_load"].record()
            step = state.pop("step")
            try:
                return original_set_states(self, model_param, tensors)
            finally:
                state["step"] = step

        original_load_state_dict = DistributedOptimizer.load_state_dict

        def load_state_dict(self, state_dict):  # noqa: ANN001, ANN202 - Megatron's method
            # it gives every torch Adam state the *same* step tensor, which torch's Adam then increments in place
            # once per parameter: each state gets its own copy
            result = original_load_state_dict(self, state_dict)
            for state in self.optimizer.state.values():
                if "step" in state:
                    SHIMS["adam_step_for_load"].record()
                    state["step"] = state["step"].clone()
            return result

        DistributedOptimizer.state_dict = state_dict
        DistributedOptimizer.load_state_dict = load_state_dict
        DistributedOptimizer._set_main_param_and_optimizer_states = set_states
    if "adam_common_step" not in skip:
        _install_adam_common_step()
    if "current_stream" not in skip:
        stream = _NoOpStream()

        def current_stream(*args: object, **kwargs: object) -> _NoOpStream:
            SHIMS["current_stream"].record()
            return stream

        torch.cuda.current_stream = current_stream
    if "cuda_side_stream" not in skip:
        side = _NoOpStream()

        def new_stream(*args: object, **kwargs: object) -> _NoOpStream:
            SHIMS["cuda_side_stream"].record()
            return side

        torch.cuda.Stream = new_stream
        torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    if "mla_have_te_flag" not in skip:
        import megatron.core.transformer.multi_latent_attention as mla

        if mla.HAVE_TE and not isinstance(mla.TELinear, type):
            mla.HAVE_TE = False
            SHIMS["mla_have_te_flag"].hits["megatron/core/transformer/multi_latent_attention.py:184 (__init__)"] += 1
    if "moe_te_general_gemm_name" not in skip:
        from megatron.core.transformer.moe import moe_utils

        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
            SHIMS["moe_te_general_gemm_name"].hits["megatron/core/transformer/moe/moe_utils.py:1192 (forward)"] += 1
    if "gloo_uneven_all_gather" not in skip:
        _install_uneven_all_gather()
    rewrite, report = "cuda_device_to_cpu" not in skip, "cuda_tensor_type" not in skip
    if rewrite or report:
        _device_mode(rewrite, report).__enter__()  # for the life of the rank process
    return [s for n, s in SHIMS.items() if n not in skip]


class _UnpaddingWork:
    """An asynchronous padded all-gather's handle: ``wait`` waits, then copies each piece out of its padding."""

    def __init__(self, work: object, unpad: object) -> None:
        self._work, self._unpad = work, unpad

    def wait(self, *args: object) -> bool:
        self._work.wait(*args)
        self._unpad()
        return True


def _install_uneven_all_gather() -> None:
    import torch.distributed as dist

    original = dist.all_gather

    def all_gather(tensor_list, tensor, group=None, async_op=False):  # noqa: ANN001, ANN202 - torch's signature
        sizes = {t.numel() for t in tensor_list} | {tensor.numel()}
        if len(sizes) == 1 or dist.get_backend(group) != "gloo":
            return original(tensor_list, tensor, group=group, async_op=async_op)
        SHIMS["gloo_uneven_all_gather"].record()
        longest = max(sizes)
        padded = torch.zeros(longest, dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.numel()] = tensor.reshape(-1)
        gathered = [torch.empty_like(padded) for _ in tensor_list]
        work = original(gathered, padded, group=group, async_op=async_op)

        def unpad() -> None:
            for out, full in zip(tensor_list, gathered, strict=True):
                out.copy_(full[: out.numel()].view_as(out))

        if not async_op:
            unpad()
            return None
        return _UnpaddingWork(work, unpad)  # nemo_muon's owner_gather gathers asynchronously (in the next forward)

    dist.all_gather = all_gather


def hits_by_file() -> dict[str, set[str]]:
    """Shim name -> the Megatron files that hit it so far."""
    return {n: {site.split(":", 1)[0] for site in s.hits} for n, s in SHIMS.items()}

"""What each parameter of an ``nn.Module`` is, read from the model itself: module types, tying and known fused layouts.

``module_roles(model)`` gives every parameter a `ParamRole` (``nemo_muon.optim.routing`` routes by it before the name
rule). Every owner of a parameter counts (a tied weight has two), by identity:
- **embeddings**: the weight of an ``nn.Embedding`` / ``nn.EmbeddingBag``, and so any weight tied to one -> AdamW;
- **the output head** (the layer producing the vocabulary logits, tied or not) -> AdamW: HF ``get_output_embeddings()``;
  else the model's *last* ``nn.Linear`` (registration order, ``named_modules()``) when its weight has the shape of an
  embedding table of the model (out_features = num_embeddings, in_features = embedding_dim). A head defined before
  the body, or of another shape, is not found this way: its name may still say so (``lm_head``), else it is
  reported as unsure when its name hints at one (``HINT_WORDS``), else it gets the matrix update;
- **norms** (``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GroupNorm``, batch / instance norms, and any module whose class name
  ends in ``Norm``: HF ``LlamaRMSNorm``, ...) and **biases** (attribute ``bias``, ``bias_*``, ``*_bias``) -> AdamW;
- **convolution kernels** (``nn.Conv1d/2d/3d``, transposed too) are neither matrices nor expert stacks: refused unless
  a param group's ``algorithm`` or ``matrix_rule`` places them;
- **fused layouts**: ``nn.MultiheadAttention.in_proj_weight`` ((3E, E) = [q; k; v]) -> ``QKVLayout(1, 1, E)``; HF's
  ``Conv1D`` (GPT-2 family) stores (in, out) (``transposed``), and its ``c_attn`` under a module with
  ``split_size`` and 3·split_size outputs is [q | k | v] on the columns -> ``QKVLayout(1, 1, split_size)``.
  HF gate/up (``gate_up_proj``) and Megatron names keep their name-segment layouts.
Everything else (a ``Linear`` weight, a 3-D expert stack held by an experts module, a router's matrix) is described
and left to the name rule.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from nemo_muon.optim.routing import ADAMW, ParamRole, QKVLayout

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_CONVS = (nn.modules.conv._ConvNd,)


def _owners(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, torch.Tensor]]:
    """(module name, module, attribute, parameter) for every place a parameter is held (tied ones more than once)."""
    for mname, module in model.named_modules(remove_duplicate=False):
        for attr, p in module.named_parameters(recurse=False, remove_duplicate=False):
            yield mname, module, attr, p


def _is_hf_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2 family): ``weight`` stored (nx, nf) = (in, out)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor)
            and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


def _output_head(model: nn.Module, tables: dict[tuple[int, ...], str]) -> tuple[nn.Module | None, str]:
    """The output head module and how it was found (module docstring), or (None, "")."""
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            head = getter()
        except (NotImplementedError, AttributeError):
            head = None
        if isinstance(head, nn.Module):
            return head, "get_output_embeddings()"
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if linears:
        name, last = linears[-1]
        table = tables.get(tuple(last.weight.shape))
        if table is not None:
            return last, f"the model's last Linear, shaped like embedding {table!r}"
    return None, ""


def _fused_role(model: nn.Module, mname: str, module: nn.Module, attr: str, p: torch.Tensor) -> ParamRole | None:
    """The role of a parameter with a fused layout the model's structure shows, or None."""
    if isinstance(module, nn.MultiheadAttention) and attr == "in_proj_weight" and p.shape[0] == 3 * p.shape[1]:
        return ParamRole(f"fused Q, K, V of nn.MultiheadAttention {mname!r}",
                         layout=QKVLayout(1, 1, int(p.shape[1])))
    if _is_hf_conv1d(module) and attr == "weight":
        parent_name, _, own = mname.rpartition(".")
        parent = model.get_submodule(parent_name) if mname else None
        split = getattr(parent, "split_size", None)
        if own == "c_attn" and isinstance(split, int) and p.shape[1] == 3 * split:
            return ParamRole(f"fused Q, K, V of HF Conv1D {mname!r}, stored (in, out)",
                             layout=QKVLayout(1, 1, split), transposed=True)
        return ParamRole(f"HF Conv1D {mname!r}, stored (in, out)", transposed=True)
    return None


def _role(model: nn.Module, mname: str, module: nn.Module, attr: str, p: torch.Tensor) -> ParamRole:
    """The role one owner gives its parameter (without tying and the head: `module_roles`)."""
    kind = type(module).__name__
    if isinstance(module, _EMBEDDINGS):
        return ParamRole(f"embedding (nn.{kind} {mname!r})", ADAMW)
    if attr == "bias" or attr.startswith("bias_") or attr.endswith("_bias"):
        return ParamRole(f"bias of {kind} {mname!r}", ADAMW)
    if isinstance(module, _NORMS) or kind.endswith("Norm"):
        return ParamRole(f"norm ({kind} {mname!r})", ADAMW)
    if isinstance(module, _CONVS) and attr == "weight":
        return ParamRole(f"convolution kernel of {kind} {mname!r}",
                         refusal=f"is a convolution kernel of {kind} {mname!r}, neither a matrix nor an expert stack")
    fused = _fused_role(model, mname, module, attr, p)
    if fused is not None:
        return fused
    return ParamRole(f"{kind} {mname!r}" if attr == "weight" else f"{kind}.{attr}" + (f" of {mname!r}" if mname else ""))


def module_roles(model: nn.Module) -> dict[torch.Tensor, ParamRole]:
    """Every parameter of ``model`` -> its `ParamRole` (module docstring). Keyed by the parameter (identity)."""
    owners = list(_owners(model))
    tables = {tuple(m.weight.shape): n for n, m, attr, _ in owners if isinstance(m, nn.Embedding) and attr == "weight"}
    head, how = _output_head(model, tables)
    embedded = {id(p): n for n, m, _, p in owners if isinstance(m, _EMBEDDINGS)}
    roles: dict[torch.Tensor, ParamRole] = {}
    for mname, module, attr, p in owners:
        if head is not None and module is head and attr == "weight":
            tied = f", tied to embedding {embedded[id(p)]!r}" if id(p) in embedded else ""
            roles[p] = ParamRole(f"output head {mname!r} ({how}){tied}", ADAMW)
        elif id(p) in embedded and not isinstance(module, _EMBEDDINGS):
            roles[p] = ParamRole(f"tied to embedding {embedded[id(p)]!r} (as {mname}.{attr})", ADAMW)
        elif p not in roles:
            roles[p] = _role(model, mname, module, attr, p)
    return roles

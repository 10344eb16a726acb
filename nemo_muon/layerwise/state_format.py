"""The state format of the layer-wise optimizer: one rank's shard of a DP-independent optimizer state.

A shard (``STATE_FORMAT``) holds, keyed by parameter name, the inner optimizer's state and the fp32 master of every
whole tensor the rank owns, and of every split matrix whose block it leads (gathered whole from the block's
members), plus the skipped-step count and the learning rate. Merging the shards of all ranks gives one state that
loads at any DP size: a rank takes the names it owns (or the slice of a split matrix it holds). Checkpoint files
(`nemo_muon.layerwise.checkpoint`) store these shards. ``optimizer`` is a
`nemo_muon.layerwise.optimizer.WholeTensorOptimizer` (not imported here: it imports this module).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_muon._validation import fail
from nemo_muon.layerwise.split_groups import gather_whole
from nemo_muon.optim.routed import place_state_value

STATE_FORMAT = "nemo_muon.layerwise/1"


def shard_state(optimizer: Any) -> dict[str, Any]:
    """This rank's shard, keyed by parameter name (merge the shards of all ranks to load at any DP size).

    A split matrix is stored whole, by the first member of its block (the members gather their slices: with
    splits, every rank of the DP group must call this together)."""
    optimizer.finish_param_gather()
    state: dict[str, dict[str, Any]] = {}
    for n in optimizer.owned_names:
        st = optimizer.inner.state.get(optimizer.masters[n], {}) if optimizer.inner is not None else {}
        state[n] = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
    masters = {n: optimizer.masters[n].detach().clone() for n in optimizer.owned_names
               if optimizer.masters[n] is not optimizer.params_by_name[n]}
    for n in optimizer.names:
        if n not in optimizer.splits:
            continue
        sm, p = optimizer.splits[n], optimizer.params_by_name[n]
        master = optimizer.masters[sm.key]
        piece_shape = sm.pieces[sm.index].shape
        st = optimizer.split_inner_of[sm.key].state.get(master, {})
        whole = {k: gather_whole(v.detach(), sm.pieces, p, sm.group)
                 if torch.is_tensor(v) and tuple(v.shape) == piece_shape else v for k, v in sorted(st.items())}
        whole_master = gather_whole(master.detach(), sm.pieces, p, sm.group) if master.dtype != p.dtype else None
        if sm.index == 0:
            state[n] = whole
            if whole_master is not None:
                masters[n] = whole_master
    group = optimizer.param_groups[0]
    return {"format": STATE_FORMAT, "names": list(optimizer.names), "owned": [n for n in optimizer.names if n in state],
            "state": state, "masters": masters, "skipped_steps": optimizer.skipped_steps,
            "lr": group["lr"], "initial_lr": group.get("initial_lr")}


def load_shard_state(optimizer: Any, state_dict: dict[str, Any]) -> None:
    """Load a (merged) state dict: every name this rank owns or helps orthogonalize must be present; unknown
    names are an error."""
    if state_dict.get("format") != STATE_FORMAT:
        raise fail("state_dict['format']", state_dict.get("format"), repr(STATE_FORMAT))
    unknown = sorted(set(state_dict["state"]) - set(optimizer.names))
    if unknown:
        raise ValueError(f"state_dict has parameters this model lacks: {unknown[:10]}")
    missing = [n for n in optimizer.state_names if n not in state_dict["state"]]
    if missing:
        raise ValueError(f"state_dict lacks optimizer state for parameters owned here: {missing[:10]}")
    optimizer.finish_param_gather()
    with torch.no_grad():
        for n in optimizer.owned_names:
            master, p = optimizer.masters[n], optimizer.params_by_name[n]
            if master is not p:
                src = state_dict["masters"].get(n, p)
                master.copy_(src)
            if optimizer.inner is not None:
                st = state_dict["state"][n]
                optimizer.inner.state[master] = {k: place_state_value(k, v, master.device) for k, v in st.items()}
        for n, sm in optimizer.splits.items():
            master, p, piece = optimizer.masters[sm.key], optimizer.params_by_name[n], sm.pieces[sm.index]
            master.copy_(piece.read(state_dict["masters"].get(n, p)))
            st = {k: piece.read(v) if torch.is_tensor(v) and v.shape == p.shape else v
                  for k, v in state_dict["state"][n].items()}
            optimizer.split_inner_of[sm.key].state[master] = {k: place_state_value(k, v, master.device)
                                                          for k, v in st.items()}
    optimizer.skipped_steps = int(state_dict.get("skipped_steps", 0))
    optimizer.param_groups[0]["lr"] = state_dict["lr"]
    if state_dict.get("initial_lr") is not None:
        optimizer.param_groups[0]["initial_lr"] = state_dict["initial_lr"]

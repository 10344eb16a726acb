"""Megatron-Core 0.16 / 0.17 (NGC 26.02 / 26.04): no emerging-optimizer registry and no DDP parameter layout. Our
matrix optimizer is assembled into Megatron's layer-wise optimizer (`assembly`), which owns the matrices by update
cost (`cost_balanced`); with ``optimizer.collectives=reduce_scatter`` (opt-in; the default is Megatron's all-reduce)
gradients are reduced to their owners (`owner_reduce`) and parameters gathered in the next forward (`owner_gather`).
Delete with those releases: this folder and its row of `nemo_muon.megatron.generations`.
"""

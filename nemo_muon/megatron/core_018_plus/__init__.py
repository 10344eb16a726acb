"""Megatron-Core >= 0.18 (NGC 26.06 onwards): our optimizers enter through Megatron's emerging-optimizer registry
(`registry_entry`) and DDP is built on a parameter layout owned by update cost (`cost_layout`), with split ownership
planned per pipeline stage (`split_plan`) and its block shares attached after the build (`split_shares`).
"""

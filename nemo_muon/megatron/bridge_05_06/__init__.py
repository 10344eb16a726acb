"""Megatron-Bridge 0.5 / 0.6 (NGC 26.06 / 26.08, Megatron-Core >= 0.18): DDP of Bridge's own model setup on the
cost layout (`layout`: a pre-wrap hook and one pinned, rebound name).
"""

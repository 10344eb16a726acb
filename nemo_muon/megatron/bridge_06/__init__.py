"""Megatron-Bridge 0.6 (NGC 26.08): Bridge's own perf recipe functions as a container's base (`perf_recipes`).
"""

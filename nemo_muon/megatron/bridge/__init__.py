"""What every supported Megatron-Bridge generation shares: a recipe -> Bridge's `ConfigContainer` -> Bridge's
`pretrain` (`container`), and the published perf layouts the recipes are built from (`perf_presets`, torch-free).
"""

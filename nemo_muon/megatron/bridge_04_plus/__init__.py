"""Megatron-Bridge >= 0.4 (NGC 26.04 onwards): engine 'nemo_muon' through Bridge's own extension point,
`OptimizerConfig.provide()` (`provider`): nothing of Bridge is patched.
"""

"""Megatron-Bridge 0.3 (NGC 26.02): its library recipes and perf-script fields as a container's base
(`library_recipe`), and engine 'nemo_muon' entering its optimizer setup through one rebound name (`hook`).
"""

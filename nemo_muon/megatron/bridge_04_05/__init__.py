"""Megatron-Bridge 0.4 / 0.5 (NGC 26.04 / 26.06): the library recipe with the release's perf-script fields mirrored as
data as a container's base (`library_recipe`, `perf_scripts`); their perf configs are outside the wheel.
"""

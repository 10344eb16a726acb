"""nemo_muon.megatron."""

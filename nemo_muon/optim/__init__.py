"""nemo_muon.optim."""

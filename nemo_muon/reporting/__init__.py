"""nemo_muon.reporting."""

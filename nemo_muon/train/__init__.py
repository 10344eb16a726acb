"""nemo_muon.train."""

"""nemo_muon.accounting."""

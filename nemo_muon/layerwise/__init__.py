"""nemo_muon.layerwise."""

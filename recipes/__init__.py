"""Recipe factories (importable as nemo_muon.recipes)."""

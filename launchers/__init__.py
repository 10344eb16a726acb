"""The nemo-muon operator CLI (importable as nemo_muon.launchers)."""

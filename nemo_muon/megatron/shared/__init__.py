"""What every supported Megatron-Core / Megatron-Bridge generation shares: our optimizers as Megatron's engine
class, the non-finite policy, the checkpoint wrappers and files, the optimizer-config mapping, the stack rules, the
update-cost items both ownership generations plan with, and the build that picks a generation
(`nemo_muon.megatron.generations`). Nothing here imports a generation folder.
"""

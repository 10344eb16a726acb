"""nemo_muon.train: the torch backend of `pretrain` (HF models, nemo_muon optimizers, gloo/NCCL data parallelism).

Modules: data (corpus, indexed datasets, split, batches), tokenizer (local byte-level BPE), schedule, metrics
(JSONL, TensorBoard, progress line), flops (accounting per step), optimizers (DP wiring;
checkpoints are nemo_muon.layerwise.checkpoint's), state (a checkpoint's training state, resume checks),
divergence (skipped-step warnings and stop), refusals (one-line refusals, exit codes), loop (`train`), pretrain
(`pretrain`, torchrun entry), spawn (`launch_local`), demo (`make demo`).
Importing this package loads nothing heavy; see docs/cpu_pipeline.md.
"""

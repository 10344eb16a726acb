"""A byte-level BPE tokenizer trained locally with HF `tokenizers` on a bounded sample of a corpus, and cached.

Byte-level BPE covers every input byte, so nothing is ever mapped to an unknown token. Training sees a bounded,
deterministic sample (`sample_documents`), which keeps it to a few seconds on a CPU; the result is cached as a
JSON file whose name is a hash of the sample and the vocabulary size, so every rank and every later run reuses it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from nemo_muon._validation import check_positive_int

EOS_TOKEN = "<|endoftext|>"
"""The only special token: it separates documents (id 0)."""
TOKENIZER_SAMPLE_BYTES = 3_000_000
"""Upper bound on the text the BPE trainer sees (deterministic prefix of the document sample)."""
_FORMAT_VERSION = "bpe-v1"


def sample_documents(documents: Sequence[str], max_bytes: int = TOKENIZER_SAMPLE_BYTES) -> list[str]:
    """A deterministic sample of at most ``max_bytes`` UTF-8 bytes: every k-th document, in order, for variety."""
    check_positive_int("max_bytes", max_bytes)
    total = sum(len(d.encode("utf-8")) for d in documents)
    stride = max(1, total // max_bytes)
    sample: list[str] = []
    used = 0
    for doc in documents[::stride]:
        size = len(doc.encode("utf-8"))
        if used + size > max_bytes:
            break
        sample.append(doc)
        used += size
    if not sample and documents:  # one document larger than the budget: train on its prefix
        sample.append(documents[0].encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore"))
    return sample


def train_tokenizer(documents: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with exactly ``vocab_size`` tokens (id 0 = EOS) on ``documents``."""
    check_positive_int("vocab_size", vocab_size, minimum=257)
    if not documents:
        raise ValueError("tokenizer training documents must be a non-empty list of strings; got []")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer, length=len(documents))
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer vocab_size must be <= {vocab_size}; training produced {tok.get_vocab_size()}")
    return tok


def tokenizer_key(documents: Sequence[str], vocab_size: int) -> str:
    """A content hash of the training sample and vocabulary size (the cache file name)."""
    h = hashlib.sha256(f"{_FORMAT_VERSION}|{vocab_size}|{len(documents)}".encode())
    for d in documents:
        h.update(hashlib.sha256(d.encode("utf-8")).digest())
    return h.hexdigest()[:16]


def load_or_train_tokenizer(documents: Sequence[str], vocab_size: int, cache_dir: str | os.PathLike) -> Tokenizer:
    """The cached tokenizer for this sample and vocab size, training (and caching atomically) on a miss."""
    sample = sample_documents(documents)
    path = Path(cache_dir) / f"tokenizer-{vocab_size}-{tokenizer_key(sample, vocab_size)}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = train_tokenizer(sample, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok

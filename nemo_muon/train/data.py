"""Token data for the torch backend: the Python stdlib source, a Megatron indexed dataset, or mock tokens.

Every kind ends as one flat token stream cut into windows of ``seq_length + 1`` tokens (inputs + shifted labels,
consecutive windows share one token). The last ``val_fraction`` of the windows is the validation split, the rest
is training data: deterministic, no shuffling across the split. Tokens that do not fill a last window are
counted (``dropped_tail_tokens``) and reported, never silently lost. Training batches follow a seeded
permutation of the training windows, re-drawn each epoch, so a step's batch depends only on (seed, step).

- ``stdlib_text``: the ``.py`` files of the running interpreter's standard library (present on every machine,
  no network), test suites excluded, in sorted path order; tokenized with a locally trained byte-level BPE
  (`nemo_muon.train.tokenizer`), documents separated by the EOS token; the token stream is cached as ``.npy``.
- ``indexed``: a Megatron-Core indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, format ``MMIDIDX`` version 1),
  read with numpy; documents are concatenated as stored (Megatron's preprocessing appends EOD itself).
- ``mock``: seeded uniform random tokens (throughput benchmarks).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nemo_muon._validation import check_positive_int
from nemo_muon.config.recipe import DataConfig

_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_INDEX_MAGIC = b"MMIDIDX\x00\x00"
_INDEX_DTYPES: dict[int, type] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
MOCK_TOKENS = 2_000_000
"""Length of the mock token stream."""


def stdlib_source_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The ``.py`` files under ``root`` (default: this interpreter's stdlib), test suites excluded, sorted."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ValueError(f"data corpus root must be an existing directory; got {str(base)!r}")
    files = [p for p in base.rglob("*.py") if not (_EXCLUDED_DIRS & set(p.relative_to(base).parts[:-1]))]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def read_documents(files: list[Path]) -> list[str]:
    """The text of each file (undecodable bytes become U+FFFD, never dropped); empty files are skipped."""
    docs = [f.read_bytes().decode("utf-8", errors="replace") for f in files]
    return [d for d in docs if d.strip()]


def read_indexed_dataset(prefix: str | os.PathLike) -> np.ndarray:
    """All tokens of a Megatron indexed dataset (``prefix.bin`` / ``prefix.idx``) as one int64 array."""
    idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    for p in (idx_path, bin_path):
        if not p.is_file():
            raise ValueError(f"data.path must be a Megatron indexed dataset prefix with {p.suffix} present; "
                             f"missing {str(p)!r}")
    with open(idx_path, "rb") as f:
        magic = f.read(len(_INDEX_MAGIC))
        if magic != _INDEX_MAGIC:
            raise ValueError(f"data.path index must start with {_INDEX_MAGIC!r} (Megatron MMIDIDX); "
                             f"got {magic!r} in {str(idx_path)!r}")
        (version,) = struct.unpack("<Q", f.read(8))
        if version != 1:
            raise ValueError(f"data.path index version must be 1; got {version} in {str(idx_path)!r}")
        (code,) = struct.unpack("<B", f.read(1))
        if code not in _INDEX_DTYPES:
            raise ValueError(f"data.path index dtype code must be one of {sorted(_INDEX_DTYPES)}; got {code}")
        seq_count, _doc_count = struct.unpack("<QQ", f.read(16))
        lengths = np.frombuffer(f.read(4 * seq_count), dtype=np.int32)
        pointers = np.frombuffer(f.read(8 * seq_count), dtype=np.int64)
    dtype = np.dtype(_INDEX_DTYPES[code])
    data = np.fromfile(bin_path, dtype=dtype)
    if seq_count == 0 or int(lengths.sum()) == 0:
        raise ValueError(f"data.path must hold at least one token; {str(prefix)!r} is empty")
    parts = [data[p // dtype.itemsize: p // dtype.itemsize + n] for p, n in zip(pointers, lengths, strict=True)]
    tokens = np.concatenate(parts).astype(np.int64)
    if tokens.size != int(lengths.sum()):
        raise ValueError(f"data.path .bin is shorter than its index promises: {str(bin_path)!r}")
    return tokens


@dataclass
class TokenData:
    """A token stream cut into ``seq_length + 1`` windows, split into train and validation windows."""

    tokens: np.ndarray
    seq_length: int
    num_train: int
    num_val: int
    info: dict[str, Any] = field(default_factory=dict)

    def window(self, index: int) -> np.ndarray:
        """Window ``index`` (train windows first, then validation) as ``seq_length + 1`` tokens."""
        start = index * self.seq_length
        return self.tokens[start: start + self.seq_length + 1]

    def train_batch_ids(self, step: int, global_batch_size: int, seed: int) -> np.ndarray:
        """The training window ids of optimizer step ``step`` (0-based): a slice of per-epoch permutations."""
        start = step * global_batch_size
        ids = np.empty(global_batch_size, dtype=np.int64)
        for k in range(global_batch_size):
            epoch, pos = divmod(start + k, self.num_train)
            ids[k] = _epoch_permutation(self.num_train, seed, epoch)[pos]
        return ids

    def val_ids(self, count: int | None = None) -> np.ndarray:
        """The first ``count`` validation window ids (all of them for None)."""
        n = self.num_val if count is None else min(count, self.num_val)
        return np.arange(self.num_train, self.num_train + n, dtype=np.int64)

    def batch(self, ids: np.ndarray) -> np.ndarray:
        """Windows ``ids`` stacked as an int64 array [len(ids), seq_length + 1]."""
        return np.stack([self.window(int(i)) for i in ids]).astype(np.int64)


_PERM_CACHE: dict[tuple[int, int, int], np.ndarray] = {}


def _epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _PERM_CACHE:
        _PERM_CACHE[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERM_CACHE[key]


def split_tokens(tokens: np.ndarray, seq_length: int, val_fraction: float, info: dict[str, Any]) -> TokenData:
    """Cut ``tokens`` into windows and hold out the last ``val_fraction`` of them (at least one) for validation."""
    check_positive_int("trainer.seq_length", seq_length)
    windows = (tokens.size - 1) // seq_length if tokens.size > 1 else 0
    num_val = max(1, round(windows * val_fraction))
    if windows - num_val < 1:
        raise ValueError(
            f"dataset must hold at least {2 * seq_length + 1} tokens for trainer.seq_length={seq_length} "
            f"(one train and one validation window); got {tokens.size} tokens"
        )
    info = dict(info, total_tokens=int(tokens.size), windows=windows, train_windows=windows - num_val,
                val_windows=num_val, dropped_tail_tokens=int(tokens.size - 1 - windows * seq_length))
    return TokenData(tokens=tokens, seq_length=seq_length, num_train=windows - num_val, num_val=num_val, info=info)


def _corpus_tokens(documents: list[str], vocab_size: int, cache_dir: Path) -> tuple[np.ndarray, dict[str, Any]]:
    from nemo_muon.train.tokenizer import EOS_TOKEN, load_or_train_tokenizer, tokenizer_key

    if not documents:
        raise ValueError("data corpus must contain at least one non-empty document; got none")
    tok = load_or_train_tokenizer(documents, vocab_size, cache_dir)
    key = tokenizer_key(documents, vocab_size)
    path = cache_dir / f"tokens-{vocab_size}-{key}.npy"
    if path.is_file():
        tokens = np.load(path)
    else:
        eos = tok.token_to_id(EOS_TOKEN)
        encoded = tok.encode_batch(documents, add_special_tokens=False)
        dtype = np.uint16 if vocab_size <= 2**16 else np.int32
        tokens = np.concatenate([np.asarray(e.ids + [eos], dtype=dtype) for e in encoded])
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npy")
        np.save(tmp, tokens)
        os.replace(tmp, path)
    info = {"documents": len(documents), "corpus_bytes": sum(len(d.encode("utf-8")) for d in documents),
            "tokenizer_vocab": tok.get_vocab_size(), "cache": str(path)}
    return tokens.astype(np.int64), info


def default_cache_dir(data: DataConfig, logging_root: str) -> Path:
    """Where tokenizers and token streams are cached: data.tokenizer_dir, else <logging.root>/_cache."""
    return Path(data.tokenizer_dir) if data.tokenizer_dir else Path(logging_root) / "_cache"


def build_token_data(data: DataConfig, *, vocab_size: int, seq_length: int, seed: int,
                     cache_dir: str | os.PathLike) -> TokenData:
    """Build (or load from cache) the token data a recipe's ``data`` section describes.

    ``data.corpus_root`` replaces the stdlib directory for kind='stdlib_text' (small trials and tests).
    """
    data.validate()
    if data.kind == "stdlib_text":
        corpus_root = data.corpus_root
        files = stdlib_source_files(corpus_root)
        documents = read_documents(files)
        if not documents:
            raise ValueError(f"data corpus must contain non-empty .py files; found none under {str(corpus_root)!r}")
        tokens, info = _corpus_tokens(documents, vocab_size, Path(cache_dir))
        info["source"] = str(corpus_root) if corpus_root else "python-stdlib"
    elif data.kind == "indexed":
        tokens = read_indexed_dataset(data.path)
        info = {"source": data.path}
    else:
        tokens = np.random.default_rng(seed).integers(0, vocab_size, size=MOCK_TOKENS, dtype=np.int64)
        info = {"source": "mock"}
    max_id = int(tokens.max())
    if max_id >= vocab_size:
        raise ValueError(f"data token ids must be < the model's vocab_size {vocab_size}; found id {max_id}")
    info["kind"] = data.kind
    info["fingerprint"] = hashlib.sha256(tokens[: 1 << 16].tobytes()).hexdigest()[:12]
    return split_tokens(tokens, seq_length, data.val_fraction, info)

"""Tokenizer, corpus and dataset builders of the torch backend, on a small real corpus (stdlib files)."""

import shutil
import struct

import numpy as np
import pytest

from nemo_muon.config.recipe import DataConfig, SchedulerConfig
from nemo_muon.train.data import build_token_data, read_indexed_dataset, stdlib_source_files
from nemo_muon.train.schedule import lr_multiplier
from nemo_muon.train.tokenizer import EOS_TOKEN, load_or_train_tokenizer, sample_documents, train_tokenizer


def small_corpus(root, n=12):
    """A small real corpus: the first ``n`` stdlib modules of 2-20 KB, copied under ``root``."""
    files = [f for f in stdlib_source_files() if 2_000 < f.stat().st_size < 20_000][:n]
    for i, f in enumerate(files):
        shutil.copy(f, root / f"m{i:02d}.py")
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus"))


def _docs(corpus):
    return [p.read_text() for p in sorted(corpus.glob("*.py"))]


def test_tokenizer_is_deterministic_lossless_and_sized(corpus):
    docs = _docs(corpus)
    a, b = train_tokenizer(docs, 600), train_tokenizer(docs, 600)
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size() == 600 and a.token_to_id(EOS_TOKEN) == 0
    text = "def f(x):\n    return x ** 2  # \u00e9\u4e2d\n"
    assert a.decode(a.encode(text).ids) == text  # byte-level: no unknown tokens, exact round trip


def test_tokenizer_cache_is_reused(corpus, tmp_path):
    docs = _docs(corpus)
    first = load_or_train_tokenizer(docs, 500, tmp_path)
    (cached,) = tmp_path.glob("tokenizer-500-*.json")
    mtime = cached.stat().st_mtime_ns
    second = load_or_train_tokenizer(docs, 500, tmp_path)
    assert cached.stat().st_mtime_ns == mtime and first.to_str() == second.to_str()


def test_sample_is_bounded_and_deterministic():
    docs = [f"doc{i} " * 50 for i in range(100)]
    s = sample_documents(docs, max_bytes=2_000)
    assert sum(len(d) for d in s) <= 2_000 and s == sample_documents(docs, max_bytes=2_000) and s[0] == docs[0]


def test_stdlib_split_accounts_for_every_token(corpus, tmp_path):
    data = build_token_data(DataConfig(kind="stdlib_text", val_fraction=0.1, corpus_root=str(corpus)), vocab_size=512,
                            seq_length=32, seed=1, cache_dir=tmp_path)
    info = data.info
    assert info["documents"] == 12 and info["total_tokens"] == data.tokens.size
    assert data.num_train + data.num_val == info["windows"]
    assert info["windows"] * 32 + 1 + info["dropped_tail_tokens"] == data.tokens.size  # nothing silently lost
    assert 0 <= info["dropped_tail_tokens"] < 32
    assert data.num_val == round(info["windows"] * 0.1)
    assert (data.tokens == 0).sum() == 12  # one EOS per document
    # validation windows are the tail; windows overlap by exactly one token (input + shifted label)
    assert data.val_ids()[0] == data.num_train
    np.testing.assert_array_equal(data.window(0)[-1:], data.window(1)[:1])
    again = build_token_data(DataConfig(kind="stdlib_text", val_fraction=0.1, corpus_root=str(corpus)), vocab_size=512,
                             seq_length=32, seed=1, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.tokens, data.tokens)


def test_batches_are_a_seeded_permutation(corpus, tmp_path):
    data = build_token_data(DataConfig(kind="stdlib_text", corpus_root=str(corpus)), vocab_size=512, seq_length=32,
                            seed=5, cache_dir=tmp_path)
    n = data.num_train
    steps = n // 8
    epoch = np.concatenate([data.train_batch_ids(s, 8, seed=5) for s in range(steps)])
    assert len(set(epoch.tolist())) == len(epoch)  # no window twice within an epoch
    assert epoch.max() < n  # never a validation window
    np.testing.assert_array_equal(data.train_batch_ids(3, 8, seed=5), data.train_batch_ids(3, 8, seed=5))
    assert not np.array_equal(data.train_batch_ids(0, 8, seed=5), data.train_batch_ids(0, 8, seed=6))
    assert data.batch(data.train_batch_ids(0, 8, seed=5)).shape == (8, 33)


def write_indexed(prefix, docs, dtype=np.uint16):
    """Megatron-Core's MMIDIDX v1 layout (indexed_dataset._IndexWriter): header, counts, lengths, pointers, doc ends."""
    itemsize = np.dtype(dtype).itemsize
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * itemsize)]).astype(np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", {np.uint16: 8, np.int32: 4}[dtype]))
        f.write(struct.pack("<QQ", len(docs), len(docs) + 1))
        f.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_indexed_dataset_roundtrip(tmp_path, dtype):
    prefix = str(tmp_path / "corpus")
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, size=int(rng.integers(5, 60))) for _ in range(20)]
    write_indexed(prefix, docs, dtype)
    np.testing.assert_array_equal(read_indexed_dataset(prefix), np.concatenate(docs))
    data = build_token_data(DataConfig(kind="indexed", path=prefix), vocab_size=1000, seq_length=16, seed=0,
                            cache_dir=tmp_path)
    assert data.info["total_tokens"] == sum(len(d) for d in docs)
    with pytest.raises(ValueError, match=r"data token ids must be < the model's vocab_size 500; found id 9\d\d"):
        build_token_data(DataConfig(kind="indexed", path=prefix), vocab_size=500, seq_length=16, seed=0,
                         cache_dir=tmp_path)


def test_missing_or_empty_data_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"data.path must be a Megatron indexed dataset prefix.*missing '.*nope.idx'"):
        read_indexed_dataset(tmp_path / "nope")
    (tmp_path / "empty.idx").write_bytes(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) + bytes(16))
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"data.path must hold at least one token; '.*empty' is empty"):
        read_indexed_dataset(tmp_path / "empty")
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"must start with b'MMIDIDX"):
        read_indexed_dataset(tmp_path / "bad")
    empty_dir = tmp_path / "no_py"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match=r"data corpus must contain non-empty .py files; found none under"):
        build_token_data(DataConfig(kind="stdlib_text", corpus_root=str(empty_dir)), vocab_size=512, seq_length=8, seed=0,
                         cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"data corpus root must be an existing directory; got '.*absent'"):
        build_token_data(DataConfig(kind="stdlib_text", corpus_root=str(tmp_path / "absent")), vocab_size=512, seq_length=8,
                         seed=0, cache_dir=tmp_path)


def test_dataset_too_small_for_sequence_length(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"dataset must hold at least 200001 tokens for trainer.seq_length=100000"):
        build_token_data(DataConfig(kind="stdlib_text", corpus_root=str(corpus)), vocab_size=512, seq_length=100_000,
                         seed=0, cache_dir=tmp_path)


@pytest.mark.parametrize("kind", ["cosine", "wsd", "constant"])
def test_schedule_shapes(kind):
    cfg = SchedulerConfig(kind=kind, warmup_steps=10, min_lr_ratio=0.1, wsd_decay_fraction=0.2)
    lrs = [lr_multiplier(cfg, s, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))  # linear warmup
    if kind == "constant":
        assert set(lrs[10:]) == {1.0}
    else:
        assert lrs[-1] == pytest.approx(0.1)
        assert all(b <= a + 1e-12 for a, b in zip(lrs[10:-1], lrs[11:], strict=True))
    if kind == "wsd":
        assert lrs[79] == 1.0 and lrs[80] == 1.0 and lrs[81] < 1.0  # stable, then the last 20% decays
    with pytest.raises(ValueError, match=r"step must be in \[0, 100\); got 100"):
        lr_multiplier(cfg, 100, 100)

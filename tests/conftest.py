"""Shared test configuration: tests run on CPU, single-threaded per process, deterministic."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

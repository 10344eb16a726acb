"""`nemo_muon.megatron` loads its submodules on first attribute access: every one is reachable that way, and importing
the package itself imports none of them (nor Megatron-Core, Bridge or NeMo)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nemo_muon.megatron as megatron_package


def test_every_submodule_is_reachable_by_attribute():
    root = Path(megatron_package.__file__).parent
    files = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    folders = {p.parent.name for p in root.glob("*/__init__.py")}
    assert set(megatron_package.SUBMODULES) == files | folders


def test_importing_the_package_imports_no_submodule_and_no_megatron():
    code = ("import sys, nemo_muon.megatron; "
            "print(sorted(m for m in sys.modules if m.startswith(('nemo_muon.megatron.', 'megatron', 'nemo.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"

"""Files a command is pointed at or writes, given by an attacker: FIFOs, devices, planted symbolic links, a folder
below a regular file. Each is refused in one line naming the file (no traceback, no hang, no MemoryError) and
nothing is written outside the run's own folder (`nemo_muon.config.files`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.run_recipe import main as run_recipe_main
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.resolved import document_text, to_document, write_document

from nemo_muon.config.files import read_file, write_file

HANG_S = 20
"""A refusal takes milliseconds; a command blocked on a FIFO is stopped (and fails) after this long."""


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def _one_line_refusal(result, *needles: str) -> None:  # noqa: ANN001 - click's Result
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and all(n in text for n in needles), result.output


@pytest.mark.timeout(HANG_S)
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_an_input_file_is_refused_by_kind_without_blocking(fifo: Path, kind: str,
                                                                                 tmp_path: Path) -> None:
    given = str(fifo) if kind == "fifo" else "/dev/zero"
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    commands = [["plan", "--recipe", "tiny_kimi_k2_muon", "--gpu-peaks", given],
                ["profiles", "--profiles", given],
                ["launch", "--recipe", "tiny_kimi_k2_muon", "--cluster", "x", "--profiles", given, "--dry-run"],
                ["report", given, "--out", str(tmp_path / "out")]]
    for args in commands:
        _one_line_refusal(CliRunner().invoke(main, args), "must be a regular file", what)
    from_env = CliRunner(env={"NEMO_MUON_PROFILES": given}).invoke(main, ["profiles"])
    _one_line_refusal(from_env, "must be a regular file", what)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_the_recipe_file_is_refused_without_blocking_or_reading_it(fifo: Path,
                                                                                        kind: str) -> None:
    """In a child process with a memory cap: the old check trusted ``st_size`` (0 for both) and read on."""
    given = str(fifo) if kind == "fifo" else "/dev/zero"
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from nemo_muon.launchers.run_recipe import main; sys.exit(main(['--recipe-file', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, given], capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "--recipe-file must be a regular file" in done.stderr


def test_the_bounded_reader_refuses_what_is_larger_than_its_bound(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(ValueError, match=r"^--recipe-file must be at most 1000 bytes; got '.*big.json', a larger"):
        read_file(big, max_bytes=1000, what="--recipe-file")
    assert read_file(big, max_bytes=1001, what="--recipe-file") == b"x" * 1001


def _plant_link(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


def test_launch_never_writes_its_sbatch_script_through_a_planted_dangling_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "runs", tmp_path / "outside" / "evil.sh"
    outside.parent.mkdir()
    run_dir = root / "tiny_kimi_k2_muon"
    _plant_link(run_dir / "nemo-muon-tiny_kimi_k2_muon-1.sbatch", outside)  # .exists() is False for it
    result = CliRunner(env={"PATH": str(tmp_path / "no-slurm")}).invoke(main, [
        "launch", "--recipe", "tiny_kimi_k2_muon", "--executor", "slurm", "--no-container", f"logging.root={root}"])
    assert "Traceback" not in result.output and result.exit_code != 0  # sbatch is not installed here
    assert not outside.exists(), "the script was written through the planted link"
    assert (run_dir / "nemo-muon-tiny_kimi_k2_muon-2.sbatch").is_file()  # the next free name, inside the folder
    assert [p.name for p in outside.parent.iterdir()] == []


def test_launch_refuses_a_run_folder_that_is_a_symbolic_link(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant_link(root / "tiny_kimi_k2_muon", elsewhere)
    result = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--dry-run",
                                       f"logging.root={root}"])
    _one_line_refusal(result, "logging.run_name must name a run folder, not a symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_the_report_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"event": "train", "step": 1, "loss": 2.0}) + "\n")
    out, outside = tmp_path / "out", tmp_path / "outside.md"
    outside.write_text("keep me\n")
    _plant_link(out / "report.md", outside)
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(out)])
    _one_line_refusal(result, "report.md must not be a symbolic link")
    assert outside.read_text() == "keep me\n"
    _plant_link(tmp_path / "out2" / "loss_vs_step.png", tmp_path / "nowhere.png")  # a PNG target: the same rule
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "out2")])
    _one_line_refusal(result, "loss_vs_step.png must not be a symbolic link")
    assert not (tmp_path / "nowhere.png").exists()


def test_report_out_below_a_regular_file_is_a_one_line_refusal(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"event": "train", "step": 1, "loss": 2.0}) + "\n")
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "file" / "sub")])
    _one_line_refusal(result, "the report folder (--out) must be a folder", "below a regular file")


def test_the_recipe_document_is_written_atomically_never_through_a_predictable_temporary_name(tmp_path: Path) -> None:
    document = to_document(build_recipe("tiny_kimi_k2_muon"), source="tiny_kimi_k2_muon")
    path, outside = tmp_path / "run" / "recipe-abc.json", tmp_path / "outside.json"
    _plant_link(path.with_name(f".{path.name}.{os.getpid()}.tmp"), outside)  # the old temporary name
    write_document(path, document)
    assert path.read_text() == document_text(document) and not outside.exists()
    _plant_link(tmp_path / "run" / "recipe-def.json", outside)
    with pytest.raises(ValueError, match="must not be a symbolic link"):
        write_document(tmp_path / "run" / "recipe-def.json", document)
    assert not outside.exists()


def test_launch_json_is_never_written_through_a_planted_link(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    root, outside = tmp_path / "runs", tmp_path / "outside.json"
    document = to_document(build_recipe("tiny_kimi_k2_muon", [f"logging.root={root}"]), source="tiny_kimi_k2_muon")
    recipe_file = write_document(tmp_path / "doc.json", document)
    _plant_link(root / "tiny_kimi_k2_muon" / "launch.json", outside)
    assert run_recipe_main(["--recipe-file", str(recipe_file)]) == 2
    err = capsys.readouterr().err
    assert "launch.json must not be a symbolic link" in err and err.strip().count("\n") == 0
    assert not outside.exists()


def test_write_file_replaces_a_regular_file_atomically_and_keeps_the_folder_clean(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    target.write_text("old")
    write_file(target, "new", what="report.md")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["report.md"]

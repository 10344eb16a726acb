"""A real single-node Slurm cluster (scripts/slurm_up.sh): submit a tiny CPU recipe, wait, check results and logs,
cancel a job, chain bench's baseline, and prove that bad input submits nothing.

Marked `system`. The tests install nothing: `make system-deps` (which `make test` runs first) installs slurm-wlm
and munge as root with apt-get; the fixture only starts the daemons (slurm_up.sh --no-install) and stops them. Skips
only where slurm-wlm/munge are not installed (slurm_up.sh exit 77, naming what is missing).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers import slurm
from nemo_muon.launchers.cli import main

from nemo_muon.reporting import load_run

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "; rm -rf ~ $(touch pwned1) `touch pwned2` \n touch pwned3"
SECRET = "hf_e2e-s3cr3t-ABC"
RECIPE = "tiny_kimi_k2_muon"

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def slurm_cluster():
    up = subprocess.run(["bash", str(REPO / "scripts" / "slurm_up.sh"), "--no-install"], capture_output=True,
                        text=True, timeout=300)
    if up.returncode == 77:
        pytest.skip(f"Slurm is not installed here: {up.stderr.strip()}")
    assert up.returncode == 0, up.stdout + up.stderr
    yield
    subprocess.run(["bash", str(REPO / "scripts" / "slurm_down.sh")], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """A few stdlib modules as the training corpus (the whole stdlib takes ~30 s to tokenize)."""
    folder = tmp_path_factory.mktemp("corpus")
    stdlib = Path(shlex.__file__).parent
    for name in ("json/decoder.py", "json/encoder.py", "json/scanner.py", "textwrap.py", "shlex.py"):
        shutil.copy(stdlib / name, folder / Path(name).name)
    return folder


def _known_jobs() -> set[str]:
    out = subprocess.run(["scontrol", "show", "jobs", "-o"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("JobId=")}


def _launch(args: list[str], env: dict[str, str] | None = None):
    return CliRunner(env=env).invoke(main, ["launch", "--recipe", RECIPE, "--executor", "slurm", "--no-container",
                                            "--time", "00:05:00", *args])


def test_tiny_recipe_trains_on_slurm_with_hostile_env_and_a_forwarded_secret(slurm_cluster, small_corpus, tmp_path,
                                                                            monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    result = _launch(["--wait", "--wait-timeout", "240", "--json", "--env", f"NM_HOSTILE={HOSTILE}", "--env",
                      "HF_TOKEN", f"data.corpus_root={small_corpus}", "trainer.max_steps=3", "scheduler.warmup_steps=1",
                      "trainer.eval_interval=3", "trainer.eval_iters=0", f"logging.root={root}"],
                     env={"HF_TOKEN": SECRET})
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["state"] == "COMPLETED" and info["exit_code"] == 0
    run_dir = root / RECIPE
    run = load_run(run_dir)
    assert [p.step for p in run.train] == [1, 2, 3] and run.val and run.world_size == 2
    log = (run_dir / f"slurm-{info['job_id']}.out").read_text()
    assert "[3/3" in log  # the training's progress lines went to the Slurm log
    launched = json.loads((run_dir / "launch.json").read_text())
    assert launched["env"]["NM_HOSTILE"] == HOSTILE and launched["slurm_job_id"] == info["job_id"]
    assert launched["env"]["HF_TOKEN"] == "**** (set)"  # it reached the job ...
    for f in run_dir.iterdir():  # ... and no file we or the job wrote holds its value
        assert SECRET not in f.read_text(errors="replace"), f
    assert SECRET not in result.output
    for folder in (tmp_path, Path.home()):
        assert not list(folder.glob("pwned*")) and not list(root.rglob("pwned*"))
    report = CliRunner().invoke(main, ["report", str(run_dir), "--out", str(tmp_path / "report"), "--json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["runs"][0]["last_step"] == 3


def test_a_refused_run_is_one_line_in_the_log_and_the_jobs_exit_code(slurm_cluster, tmp_path, monkeypatch) -> None:
    """A run every rank refuses (resume without a checkpoint) under Slurm's torchrun: rank 0's one line is the
    job's only output besides torchrun's banner, gloo's connection lines and srun's status lines, and the job's
    exit code is the refusal's."""
    from nemo_muon.train.refusals import REFUSED_EXIT

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    result = _launch(["--wait", "--wait-timeout", "240", "--json", "checkpoint.resume=true", f"logging.root={root}"])
    assert result.exit_code == REFUSED_EXIT, result.output
    info = json.loads(result.stdout)
    assert info["state"] == "FAILED" and info["exit_code"] == REFUSED_EXIT
    log = (root / RECIPE / f"slurm-{info['job_id']}.out").read_text()
    # torchrun's banner (W...), srun's status lines and gloo's connection lines (two ranks' may interleave mid-line,
    # leaving the tail of one, the peer count "1", on a line of its own)
    lines = [line for line in log.splitlines()
             if line and not line.startswith(("W", "[Gloo]", "srun: ")) and "peer ranks" not in line
             and not line.strip().isdigit()]
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint.resume=True needs a verified checkpoint"), log
    for launcher_report in ("ChildFailedError", "Traceback", "exitcode", "SIGTERM"):
        assert launcher_report not in log, log


def test_cancel_stops_a_submitted_job(slurm_cluster, tmp_path) -> None:
    result = _launch(["--json", "trainer.max_steps=100000", f"logging.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["job_id"]
    assert slurm.is_queued(job_id)
    cancelled = CliRunner().invoke(main, ["cancel", job_id])
    assert cancelled.exit_code == 0, cancelled.output
    state, _ = slurm.wait(job_id, timeout_s=30)
    assert state == "CANCELLED"


def test_ctrl_c_while_waiting_cancels_the_job(slurm_cluster, tmp_path) -> None:
    cli = [sys.executable, "-c", "from nemo_muon.launchers.cli import main; main()"]
    # Ctrl-C as from a terminal: SIGINT at its default in the launcher, even when this suite runs as a background job
    # (a shell starts those with SIGINT ignored, and an ignored signal stays ignored across exec)
    proc = subprocess.Popen([*cli, "launch", "--recipe", RECIPE, "--executor", "slurm", "--no-container", "--wait",
                             "trainer.max_steps=100000", f"logging.root={tmp_path}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job_id, seen = None, ""
    deadline = time.monotonic() + 60
    while job_id is None and time.monotonic() < deadline:
        seen += proc.stderr.read(1)
        if m := re.search(r"slurm job (\d+): ", seen):
            job_id = m.group(1)
    assert job_id is not None, seen
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"cancelled slurm job {job_id}" in err
    assert slurm.wait(job_id, timeout_s=30)[0] == "CANCELLED"


def test_bench_chains_the_baseline_after_the_muon_run(slurm_cluster, tmp_path) -> None:
    result = CliRunner().invoke(main, ["bench", "--recipe", RECIPE, "--executor", "slurm", "--no-container",
                                       "--no-wait", "--json", "--steps", "100000", f"logging.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.stdout)["runs"]
    try:
        assert (first["recipe"], second["recipe"]) == (RECIPE, "tiny_kimi_k2_adamw")
        script = next((tmp_path / "tiny_kimi_k2_adamw").glob("*.sbatch")).read_text()
        assert f"#SBATCH --dependency=afterany:{first['job_id']}" in script
        assert slurm.job_state(second["job_id"])[0] == "PENDING"
    finally:
        for job in (second["job_id"], first["job_id"]):
            slurm.cancel(job)


def test_invalid_input_submits_nothing(slurm_cluster, tmp_path) -> None:
    before = _known_jobs()
    for args in (["--gpus-per-node", "3"], ["--mount", "relative:/x"], ["trainer.max_steps=x"], ["--recipe", "nope"],
                 ["--env", "HF_TOKEN_UNSET_HERE"]):
        result = _launch([*args, f"logging.root={tmp_path}"])
        assert result.exit_code == 2, (args, result.output)
    time.sleep(0.2)
    assert _known_jobs() == before
    assert not list(tmp_path.rglob("*.sbatch"))


CPU_ANSWERS_SITE = REPO / "tests" / "megatron_cpu" / "cpu_ranks_site"
"""A sitecustomize that installs the Megatron CPU harness's shims in a preflight rank (its docstring)."""


def _preflight_gate_job(tmp_path: Path, corpus: Path, *, answered: bool) -> tuple[str, Path, str]:
    """Submit, as `nemo-muon launch --preflight` renders a megatron recipe's job (`slurm.SlurmJob.preflight`, one
    srun task per rank, no torchrun), a job whose first step is the real preflight of kimi_k2_muon's resolved recipe
    on the job's 2 CPU ranks (``--device cpu``; the shims only where ``answered``) and whose second step trains the
    tiny recipe (no megatron recipe trains on CPU); wait for it. (job id, run folder, the job's final ExitCode)."""
    import os

    from nemo_muon.recipes.execute import build_recipe
    from nemo_muon.recipes.resolved import document_path, to_document, write_document

    root = tmp_path / "runs"
    run_dir = root / RECIPE
    overrides = [f"data.corpus_root={corpus}", "trainer.max_steps=3", "scheduler.warmup_steps=1",
                 "trainer.eval_interval=3", "trainer.eval_iters=0", f"logging.root={root}"]
    training = to_document(build_recipe(RECIPE, overrides), source=RECIPE, overrides=overrides)
    proven = to_document(build_recipe("kimi_k2_muon", []), source="kimi_k2_muon")
    training_file = write_document(document_path(run_dir, training), training)
    proven_file = write_document(document_path(run_dir, proven), proven)
    job = slurm.SlurmJob(
        job_name="nemo-muon-preflight-gate", nodes=1, gpus_per_node=2, gpu="cpu", launcher="tasks",
        command=["-m", "nemo_muon.launchers.run_recipe", "--recipe-file", str(training_file)],
        preflight=["-m", "nemo_muon.preflight.main", "--recipe-file", str(proven_file), "--out",
                   str(run_dir / "preflight"), "--device", "cpu", "--steps", "4"],
        python=sys.executable, output_dir=run_dir, workdir=root, time="00:05:00", container=False,
        env={"PYTHONPATH": f"{CPU_ANSWERS_SITE}:{REPO}", "OMP_NUM_THREADS": "1"} if answered else {})
    script = run_dir / "gate.sbatch"
    script.write_text(slurm.render_sbatch(job))
    job_id = slurm.submit(script, os.environ)
    state, code = slurm.wait(job_id, timeout_s=300)
    return job_id, run_dir, f"{state} {code}"


def test_a_failed_preflight_step_ends_the_job_before_the_training_starts(slurm_cluster, small_corpus, tmp_path):
    """Without Megatron's CUDA calls answered, the preflight refuses the CPU ranks (exit 2): the job ends FAILED with
    that code and the training step never starts (no launch.json, no metrics)."""
    from nemo_muon.train.refusals import REFUSED_EXIT

    job_id, run_dir, end = _preflight_gate_job(tmp_path, small_corpus, answered=False)
    assert end == f"FAILED {REFUSED_EXIT}:0", end
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "preflight refused: preflight.device='cpu' needs Megatron-Core's CUDA calls answered on CPU" in log, log
    assert not (run_dir / "launch.json").exists() and not (run_dir / "metrics.jsonl").exists()


def test_a_passing_preflight_step_lets_the_training_run(slurm_cluster, small_corpus, tmp_path):
    """With the CPU answers, the job's preflight of kimi_k2_muon passes every check on the job's 2 gloo ranks and
    writes its report; then the training step trains its 3 steps in the same job, which ends COMPLETED."""
    job_id, run_dir, end = _preflight_gate_job(tmp_path, small_corpus, answered=True)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert end == "COMPLETED 0:0", log
    report = json.loads((run_dir / "preflight" / "preflight.json").read_text())
    assert report["passed"] and report["topology"]["world_size"] == 2, report["first_failure"]
    assert report["request"]["recipe"] == "kimi_k2_muon" and report["request"]["device"] == "cpu"
    # the recipe's layout scaled to 2 ranks, as launch runs it: EP=2, where no other layout hosts EP > 1
    assert report["topology"]["pipeline_parallel"] == 1 and report["topology"]["expert_parallel"] == 2
    assert "preflight passed: 8 checks of kimi_k2_muon (not run: reshard)" in log
    assert log.index("preflight passed") < log.index("[3/3")  # the training's progress after the preflight's verdict
    assert [p.step for p in load_run(run_dir).train] == [1, 2, 3]


def test_nemo_muon_preflight_submits_a_slurm_job_and_exits_with_its_code(slurm_cluster, tmp_path):
    """`nemo-muon preflight --executor slurm --wait`: the script and the job's log land in --out; the job's 2 srun
    tasks run the entry point, which refuses CPU ranks whose CUDA calls nothing answers (exit 2), and the CLI exits
    with that code (the passing job's ranks: the gate test above)."""
    from nemo_muon.train.refusals import REFUSED_EXIT

    out = tmp_path / "pf"
    result = CliRunner().invoke(main, [
        "preflight", "--recipe", "qwen3_30b_a3b_muon", "--executor", "slurm", "--no-container", "--nproc-per-node", "2",
        "--device", "cpu", "--time", "00:05:00", "--out", str(out), "--wait"])
    job_id = re.search(r"submitted slurm job (\d+)", result.output)
    assert job_id, result.output
    log = (out / f"slurm-{job_id.group(1)}.out").read_text()
    assert result.exit_code == REFUSED_EXIT, result.output + log
    assert f"FAILED (exit {REFUSED_EXIT})" in result.output and (out / "preflight.sbatch").exists()
    assert log.count("preflight refused: preflight.device='cpu' needs Megatron-Core's CUDA calls answered") == 1, log
    assert not (out / "preflight.json").exists()

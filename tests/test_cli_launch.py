"""`nemo-muon launch --dry-run`: the exact sbatch script / docker / torchrun lines for the recipes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.slurm import segment_size
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.resolved import document_path, to_document

IMAGE = "nvcr.io/nvidia/nemo:26.02"
NGC_DOCKER_FLAGS = "--gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864"


def _dry_run(tmp_path: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["launch", *args, "--dry-run", f"logging.root={tmp_path / 'runs'}"])
    assert result.exit_code == 0, result.output
    return result.stdout


def _job_document(out: str) -> tuple[list[str], Path]:
    """The overrides the dry run resolved the recipe with, and the path of the document that resolution gives (what
    the job's --recipe-file must name; the dry run writes nothing)."""
    source = next(line for line in out.splitlines() if line.startswith("# recipe "))[len("# recipe "):]
    name, *overrides = shlex.split(source)
    recipe = build_recipe(name, overrides)
    document = to_document(recipe, source=name, overrides=overrides)
    return overrides, document_path(Path(recipe.logging.root) / (recipe.logging.run_name or recipe.name), document)


def _script(out: str) -> str:
    start = out.index("#!/bin/bash")
    return out[start:out.index("# submit:")]


@pytest.mark.parametrize(("nodes", "segment"), [(1, 1), (16, 16), (18, 18), (19, 1), (20, 10), (36, 18), (64, 16)])
def test_segment_keeps_allocations_inside_one_nvl72_rack(nodes: int, segment: int) -> None:
    assert segment_size(nodes) == segment


def test_kimi_k2_gb300_sbatch_has_bridge_perf_lines(tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--account", "acct", "--partition",
                   "batch", "--image", IMAGE, "--mount", "/lustre/data:/data", "--time", "00:30:00")
    script = _script(out)
    lines = script.splitlines()
    root = tmp_path / "runs"
    for expected in ("#SBATCH --account=acct", "#SBATCH --partition=batch", "#SBATCH --nodes=64",
                     "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4", "#SBATCH --time=00:30:00",
                     "#SBATCH --exclusive", "#SBATCH --mem=0", "#SBATCH --segment=16",
                     f"#SBATCH --output={root}/kimi_k2_muon/slurm-%j.out"):
        assert expected in lines, expected
    for name, value in get_recipe("kimi_k2_muon").env.items():  # the recipe's NCCL/NVTE/CUDA variables
        assert f"export {name}={value}" in lines
    preflight, srun = [line for line in lines if line.startswith("srun ")]  # the GB300 recipe's two steps
    container = ["--mpi=pmix", f"--container-image={IMAGE}", f"--container-mounts=/lustre/data:/data,{root}:{root}",
                 "--no-container-mount-home", "--container-writable", f"--container-workdir={root}"]
    assert srun.split(" python ")[0].split() == ["srun", "--kill-on-bad-exit=1", *container]
    # the preflight's ranks end together with its code (a refusal 2, a failed check 1), not killed into 143
    assert preflight.split(" python ")[0].split() == ["srun", "--kill-on-bad-exit=0", "--wait=60", *container]
    overrides, document = _job_document(out)
    assert overrides == [f"logging.root={root}"]
    assert srun.endswith(f"python -m nemo_muon.launchers.run_recipe --recipe-file {document}")  # resolved once
    # the preflight first, on the same document, nodes and image; the training only after it (set -e)
    assert preflight.endswith(f"python -m nemo_muon.preflight.main --recipe-file {document} --out "
                              f"{root}/kimi_k2_muon/preflight --pp 4 --ep 8")
    assert lines.index(preflight) < lines.index(srun) and "set -euo pipefail" in lines[:lines.index(preflight)]
    assert document.parent == root / "kimi_k2_muon" and "logging.root" not in srun
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not root.exists()  # a dry run writes nothing
    assert f"sbatch --parsable --export=ALL {root}/kimi_k2_muon/nemo-muon-kimi_k2_muon-1.sbatch" in out


def test_qwen3_gb300_is_two_nodes_in_one_segment(tmp_path: Path) -> None:
    script = _script(_dry_run(tmp_path, "--recipe", "qwen3_30b_a3b_muon", "--executor", "slurm", "--image", IMAGE))
    assert "#SBATCH --nodes=2" in script and "#SBATCH --segment=2" in script
    assert "#SBATCH --account" not in script  # not given, not invented


def test_more_nodes_rescale_data_parallelism_and_segment(tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--image", IMAGE, "--nodes", "128")
    script = _script(out)
    assert "#SBATCH --nodes=128" in script and "#SBATCH --segment=16" in script
    overrides, document = _job_document(out)  # the job loads the same recipe, resolved here once
    assert "system.num_nodes=128" in overrides
    assert script.rstrip().splitlines()[-1].endswith(f"--recipe-file {document}")


def test_no_container_runs_bare_with_this_python(tmp_path: Path) -> None:
    script = _script(_dry_run(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container"))
    assert "--container" not in script
    assert f"srun --kill-on-bad-exit=1 --mpi=pmix {sys.executable} -m nemo_muon.launchers.run_recipe" in script


def test_docker_line_has_ngc_flags_mounts_env_and_entrypoint(tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--recipe", "qwen3_30b_a3b_muon", "--executor", "docker", "--image", IMAGE,
                   "--mount", "/data:/data:ro", "--env", "NCCL_DEBUG=WARN")
    line = out.splitlines()[-1]
    assert line.startswith(f"docker run --rm {NGC_DOCKER_FLAGS} --network=host -v /data:/data:ro")
    assert "-e NCCL_DEBUG=WARN" in line and "-e NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8" in line
    assert "-e PET_NODE_RANK -e PET_MASTER_ADDR" in line  # 2 GB300 nodes: each node sets its rank
    overrides, document = _job_document(out)
    assert overrides == [f"logging.root={tmp_path / 'runs'}"]
    assert line.endswith(f"{IMAGE} python -m nemo_muon.launchers.torchrun --nnodes 2 --master-port 29500 --nproc-per-node 4 "
                         f"-m nemo_muon.launchers.run_recipe --recipe-file {document}")
    assert "each of the 2 nodes" in out


def test_local_runs_torchrun_standalone_with_the_recipe_processes(tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--recipe", "qwen3_30b_a3b_muon", "--executor", "local", "--nodes", "1",
                   "--gpus-per-node", "4", "parallelism.ep=4", "trainer.global_batch_size=64")
    line = out.splitlines()[-1]
    overrides, document = _job_document(out)
    assert overrides[:2] == ["parallelism.ep=4", "trainer.global_batch_size=64"] and "system.num_nodes=1" in overrides
    assert line.endswith(f"{sys.executable} -m nemo_muon.launchers.torchrun --standalone --nproc-per-node 4 -m "
                         f"nemo_muon.launchers.run_recipe --recipe-file {document}")
    assert "NCCL_NVLS_ENABLE=0" in line  # local runs show the variables they set


def test_json_dry_run_is_one_object(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--executor", "slurm", "--image", IMAGE,
                                       "--dry-run", "--json", f"logging.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["dry_run"] is True and data["executor"] == "slurm" and "#SBATCH --segment=16" in data["script"]


def test_help_works_on_every_command() -> None:
    for cmd in ([], ["launch"], ["bench"], ["report"], ["doctor"], ["plan"], ["profiles"], ["recipes"], ["cancel"]):
        result = CliRunner().invoke(main, [*cmd, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, cmd


def test_cli_imports_no_torch() -> None:
    code = ("import sys; from click.testing import CliRunner; from nemo_muon.launchers.cli import main; "
            "r = CliRunner().invoke(main, ['launch', '--recipe', 'kimi_k2_muon', '--executor', 'slurm', '--image', "
            "'x', '--dry-run']); assert r.exit_code == 0, r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_bench_dry_run_prints_muon_then_its_baseline_on_the_same_layout(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--recipe", "kimi_k2_muon_bf16", "--executor", "slurm", "--image",
                                       IMAGE, "--steps", "20", "--dry-run", f"logging.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    first, second = result.stdout.split("# then (after it, on the same layout):")
    assert "--recipe kimi_k2_muon_bf16" in first and "--recipe kimi_k2_adamw_bf16" in second
    for part in (first, second):
        assert "#SBATCH --nodes=64" in part and "trainer.max_steps=20" in part
    bad = CliRunner().invoke(main, ["bench", "--recipe", "kimi_k2_adamw", "--dry-run"])
    assert bad.exit_code == 2 and "must name a recipe of a matrix optimizer" in bad.output
    # the optimizer is a whole token of the name, the longest registered name first
    normuon = CliRunner().invoke(main, ["bench", "--recipe", "tiny_kimi_k2_normuon", "--executor", "local",
                                        "--dry-run", f"logging.root={tmp_path}"])
    assert normuon.exit_code == 0, normuon.output
    assert "# recipe tiny_kimi_k2_adamw " in normuon.stdout.split("# then (after it, on the same layout):")[1]


def test_job_entry_takes_ranks_from_slurm_tasks_and_records_masked_env() -> None:
    from nemo_muon.launchers.run_recipe import launch_record

    from nemo_muon.rank_env import rank_env_from_slurm

    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    rank_env_from_slurm(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    rank_env_from_slurm(torchrun)
    assert torchrun["WORLD_SIZE"] == "2"  # torchrun's variables win
    record = launch_record("r", ["a=b"], {"NEMO_MUON_LAUNCH_ENV": "X,HF_TOKEN,MISSING", "X": "1", "HF_TOKEN": "s"})
    assert record["env"] == {"X": "1", "HF_TOKEN": "**** (set)", "MISSING": None}


def test_list_prints_every_recipe() -> None:
    from nemo_muon.recipes import list_recipes

    for cmd in (["launch", "--list"], ["bench", "--list"], ["recipes"]):
        result = CliRunner().invoke(main, cmd)
        assert result.exit_code == 0 and result.stdout.split() == list_recipes(), cmd


def test_local_run_output_goes_to_stderr_when_stdout_is_json(tmp_path: Path, capfd) -> None:
    import dataclasses

    from nemo_muon.launchers.job import LaunchOptions, build_plan
    from nemo_muon.launchers.launch import execute

    plan = build_plan(LaunchOptions(recipe="tiny_qwen3_moe_muon", executor="local",
                                    overrides=[f"logging.root={tmp_path}"]))
    child = dataclasses.replace(plan, argv=[sys.executable, "-c", "print('progress 1/2'); raise SystemExit(3)"])
    assert execute(child, progress=False).exit_code == 3
    out, err = capfd.readouterr()
    assert out == "" and "progress 1/2" in err


def test_slurm_commands_missing_from_path_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner(env={"PATH": str(tmp_path)}).invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon",
                                                                  "--executor", "slurm", "--no-container",
                                                                  f"logging.root={tmp_path}"])
    assert result.exit_code == 1 and "sbatch is not on PATH" in result.output and "Traceback" not in result.output
    result = CliRunner(env={"PATH": str(tmp_path)}).invoke(main, ["cancel", "12"])
    assert result.exit_code == 1 and "scancel is not on PATH" in result.output


def test_torch_backend_on_several_nodes_uses_one_torchrun_per_node_with_c10d(tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--recipe", "tiny_kimi_k2_muon", "--executor", "slurm", "--no-container", "--nodes", "2")
    script = _script(out)
    lines = script.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --cpus-per-task=2" in lines and "--gpus-per-node" not in script and "--segment" not in script
    assert (f'srun --kill-on-bad-exit=1 --ntasks-per-node=1 {sys.executable} -m nemo_muon.launchers.torchrun --nnodes "$SLURM_NNODES" '
            '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID" --nproc-per-node 2 '
            f'-m nemo_muon.launchers.run_recipe --recipe-file {_job_document(out)[1]}') in script


def test_job_entry_dispatches_each_backend_to_its_pretrain() -> None:
    from nemo_muon.recipes.execute import backend_pretrain

    from nemo_muon.megatron.bridge import container as bridge
    from nemo_muon.train import pretrain

    assert backend_pretrain("torch") is pretrain.pretrain
    assert backend_pretrain("megatron") is bridge.pretrain
    with pytest.raises(ValueError, match="recipe.backend must be one of"):
        backend_pretrain("jax")

"""Docker: the ``docker run`` command line for one node (NGC conventions for PyTorch/NCCL jobs).

``--gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864`` (NVIDIA's recommended flags for the
PyTorch containers), one ``-v SRC:DST`` per mount, ``-e NAME=value`` per variable and ``-e NAME`` (no value) for
secrets so docker copies them from the calling environment, then the image and the entrypoint. The argv is run
without a shell, so no value is ever interpreted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nemo_muon._validation import shown
from nemo_muon.config.limits import ENV_NAME

NGC_RUN_FLAGS: tuple[str, ...] = ("--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")


def docker_argv(*, image: str, command: Sequence[str], mounts: Sequence[str] = (), env: Mapping[str, str] | None = None,
                forwarded_env: Sequence[str] = (), workdir: str | None = None, gpus: bool = True,
                name: str | None = None, host_network: bool = False) -> list[str]:
    """The full ``docker run`` argv (run it with subprocess, no shell)."""
    if not image or image.startswith("-"):
        raise ValueError(f"docker image must be an image reference such as nvcr.io/nvidia/nemo:26.02; got {shown(image)}")
    argv = ["docker", "run", "--rm"]
    if name:
        argv += ["--name", name]
    if gpus:
        argv += ["--gpus", "all"]
    argv += list(NGC_RUN_FLAGS)
    if host_network:  # multi-node: NCCL and torchrun's rendezvous talk to the other nodes directly
        argv += ["--network=host"]
    for m in mounts:
        argv += ["-v", m]
    for k, v in (env or {}).items():
        if not ENV_NAME.match(k):
            raise ValueError(f"environment variable name must match [A-Za-z_][A-Za-z0-9_]*; got {shown(k)}")
        argv += ["-e", f"{k}={v}"]
    for k in forwarded_env:
        if not ENV_NAME.match(k):
            raise ValueError(f"environment variable name must match [A-Za-z_][A-Za-z0-9_]*; got {shown(k)}")
        argv += ["-e", k]
    if workdir:
        argv += ["-w", workdir]
    return [*argv, image, *command]

"""A Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``) manifest for a :class:`~accelerando.launchers.emit.JobSpec`.

Each pod runs one ``accelerando launch``, which starts that pod's processes. The Kubeflow training
operator gives every pod its place when the job runs, and the command reads it through Kubernetes'
``$(VAR)`` expansion:

- a fixed-size job has one ``Master`` pod and ``num_machines - 1`` ``Worker`` pods; the operator sets
  ``MASTER_ADDR``/``MASTER_PORT`` (the master's service and the ``pytorchjob-port`` container port) and
  ``RANK`` (the pod's index: 0 for the master), used as ``--machine_rank``;
- an elastic job (``--max_restarts``, a dynamic ``--rdzv_backend`` or ``--num_machines MIN:MAX``) has
  ``Worker`` pods only and an ``elasticPolicy`` (``minReplicas``/``maxReplicas``: the range, or the
  count twice); the pods meet through the rendezvous backend on the first worker's service
  (``<name>-worker-0``), as the operator's own ``PET_RDZV_ENDPOINT`` says.

Every other setting some layer set travels as an ``ACCELERANDO_*`` variable of the container, so the
image needs no config file. GPUs are requested as ``nvidia.com/gpu`` per pod.
"""

from __future__ import annotations

from typing import Any

from accelerando.launchers.emit.spec import JobSpec, value_text

__all__ = [
    "API_VERSION",
    "CONTAINER_NAME",
    "DEFAULT_PORT",
    "PORT_NAME",
    "pytorchjob_manifest",
    "render_manifest",
]

API_VERSION = "kubeflow.org/v1"
#: The container and port names the training operator looks for (it reads the port from them).
CONTAINER_NAME = "pytorch"
PORT_NAME = "pytorchjob-port"
#: The training operator's default port.
DEFAULT_PORT = 23456
_MACHINE_RANK = "$(RANK)"


def _container(spec: JobSpec, image: str, args: list[str], port: int) -> dict[str, Any]:
    command = spec.command
    target = ["-m"] if command.module else ["--no_python"] if command.no_python else []
    env = [{"name": f.our_env, "value": value_text(value)} for f, value in spec.carried]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["accelerando", "launch"],
        "args": [*args, *target, command.target, *command.args],
        "ports": [{"name": PORT_NAME, "containerPort": port}],
        # Data loader workers share tensors through /dev/shm, which a container keeps tiny by default.
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if env:
        container["env"] = sorted(env, key=lambda item: item["name"])
    resources: dict[str, Any] = {}
    if spec.gpus_per_node:
        resources["limits"] = {"nvidia.com/gpu": spec.gpus_per_node}
    if spec.cpus_per_node:
        resources["requests"] = {"cpu": str(spec.cpus_per_node)}
    if resources:
        container["resources"] = resources
    return container


def _replica(spec: JobSpec, count: int, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "replicas": count,
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                "containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            }
        },
    }


def pytorchjob_manifest(spec: JobSpec, image: str | None) -> dict[str, Any]:
    """Build the ``PyTorchJob`` of ``spec`` as a dict.

    Args:
        spec: the job.
        image: the container image (``--emit_image``); it must have accelerando and the script.

    Returns:
        The manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``).

    Raises:
        ValueError: no image was given.
    """
    if not image:
        raise ValueError(
            "--emit kubernetes needs the container image the pods run. Fix: pass --emit_image IMAGE, an image "
            "with accelerando, your script and its dependencies installed (e.g. one built FROM pytorch/pytorch)."
        )
    port = spec.main_port or DEFAULT_PORT
    common = ["--num_processes", str(spec.num_processes)]
    job: dict[str, Any] = {"nprocPerNode": str(spec.nproc_per_node)}
    if spec.elastic:
        backend = spec.rdzv_backend if spec.rdzv_backend != "static" else "c10d"
        args = [
            "--num_machines", spec.machines_text, "--rdzv_backend", backend,
            "--main_process_ip", f"{spec.name}-worker-0", "--main_process_port", str(port), *common,
        ]  # fmt: skip
        job["elasticPolicy"] = {
            "rdzvBackend": backend,
            "rdzvPort": port,
            "minReplicas": spec.min_machines if spec.machine_range else spec.num_machines,
            "maxReplicas": spec.num_machines,
            "maxRestarts": spec.max_restarts,
        }
        job["pytorchReplicaSpecs"] = {
            "Worker": _replica(spec, spec.num_machines, _container(spec, image, args, port))
        }
    else:
        args = [
            "--num_machines", str(spec.num_machines), "--machine_rank", _MACHINE_RANK,
            "--main_process_ip", "$(MASTER_ADDR)", "--main_process_port", "$(MASTER_PORT)", *common,
        ]  # fmt: skip
        replicas = {"Master": _replica(spec, 1, _container(spec, image, args, port))}
        if spec.num_machines > 1:  # its own copy: YAML would otherwise share it through an anchor
            replicas["Worker"] = _replica(spec, spec.num_machines - 1, _container(spec, image, args, port))
        job["pytorchReplicaSpecs"] = replicas
    job["runPolicy"] = {"cleanPodPolicy": "None"}
    return {
        "apiVersion": API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/created-by": "accelerando"}},
        "spec": job,
    }


def render_manifest(spec: JobSpec, image: str | None) -> str:
    """The ``PyTorchJob`` of ``spec`` as YAML (apply it with ``kubectl apply -f FILE``).

    Args:
        spec: the job.
        image: the container image (``--emit_image``).

    Returns:
        The YAML text, with a comment line saying what wrote it.

    Raises:
        ValueError: no image was given.
    """
    import yaml

    manifest = pytorchjob_manifest(spec, image)
    body = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
    return (
        "# Kubeflow PyTorchJob written by `accelerando launch --emit kubernetes`; `kubectl apply -f FILE`.\n"
        + body
    )

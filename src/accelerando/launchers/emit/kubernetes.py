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

Kubernetes expands ``$(VAR)`` in a container's command, args and env values, and reads ``$$`` as
``$``: every ``$`` of a value from the user (the script, its arguments, settings) is written ``$$``
(:func:`k8s_literal`), so that ``$(MASTER_ADDR)`` in a script argument arrives as typed. YAML carries
any other character (quoted by the YAML writer); the image and the job's name are one-line fields
and refuse control characters.
"""

from __future__ import annotations

import re

from accelerando.launchers.emit.spec import JobSpec, check_line, check_word, value_text

__all__ = [
    "API_VERSION",
    "CONTAINER_NAME",
    "DEFAULT_PORT",
    "PORT_NAME",
    "k8s_literal",
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
# A DNS-1123 label: what a pod's service name (``<name>-worker-0``) and the job's name must be.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_BLANK = re.compile(r"\s")


def k8s_literal(value: str, what: str) -> str:
    """Spell ``value`` so that Kubernetes' ``$(VAR)`` expansion of command, args and env gives it back.

    Args:
        value: a value from the user or the environment.
        what: how the user knows it, for the message of a refused value.

    Returns:
        ``value`` with every ``$`` doubled (``$$`` is Kubernetes' escape of ``$``).

    Raises:
        ValueError: a NUL byte, or text that is not UTF-8.
    """
    return check_word(value, what).replace("$", "$$")


def _check_image(image: str) -> str:
    check_line(
        image, "--emit_image", "an image reference", "pass the image's name without control characters"
    )
    if _BLANK.search(image):
        raise ValueError(
            f"--emit_image {image!r} contains a blank, which no image reference has. Fix: pass the image's name "
            "as `docker pull` takes it (e.g. registry.example/team/train:1.0)."
        )
    return image


def _check_name(name: str) -> str:
    check_line(name, "--emit kubernetes: the job name", "a Kubernetes name", "rename the script")
    if len(name) > 40 or not _DNS_LABEL.fullmatch(name):
        raise ValueError(
            f"--emit kubernetes: the job name {name!r} is not a Kubernetes name (lowercase letters, digits and "
            "dashes, at most 40 characters here). Fix: rename the script."
        )
    return name


def _container(spec: JobSpec, image: str, args: list[str], port: int) -> dict[str, object]:
    command = spec.command
    target = ["-m"] if command.module else ["--no_python"] if command.no_python else []
    env = [
        {"name": f.our_env, "value": k8s_literal(value_text(value), f"the value of {f.name}")}
        for f, value in spec.carried
    ]
    user = [
        k8s_literal(command.target, "the script"),
        *(k8s_literal(a, "the script argument") for a in command.args),
    ]
    container: dict[str, object] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["accelerando", "launch"],
        "args": [*args, *target, *user],
        "ports": [{"name": PORT_NAME, "containerPort": port}],
        # Data loader workers share tensors through /dev/shm, which a container keeps tiny by default.
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if env:
        container["env"] = sorted(env, key=lambda item: item["name"])
    resources: dict[str, object] = {}
    if spec.gpus_per_node:
        resources["limits"] = {"nvidia.com/gpu": spec.gpus_per_node}
    if spec.cpus_per_node:
        resources["requests"] = {"cpu": str(spec.cpus_per_node)}
    if resources:
        container["resources"] = resources
    return container


def _replica(spec: JobSpec, count: int, container: dict[str, object]) -> dict[str, object]:
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


def pytorchjob_manifest(spec: JobSpec, image: str | None) -> dict[str, object]:
    """Build the ``PyTorchJob`` of ``spec`` as a dict.

    Args:
        spec: the job.
        image: the container image (``--emit_image``); it must have accelerando and the script.

    Returns:
        The manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``).

    Raises:
        ValueError: no image was given, the image or the job's name is not one (a control character, a
            blank), or a value holds a NUL byte.
    """
    if not image:
        raise ValueError(
            "--emit kubernetes needs the container image the pods run. Fix: pass --emit_image IMAGE, an image "
            "with accelerando, your script and its dependencies installed (e.g. one built FROM pytorch/pytorch)."
        )
    _check_image(image)
    name = _check_name(spec.name)
    port = spec.main_port or DEFAULT_PORT
    common = ["--num_processes", str(spec.num_processes)]
    job: dict[str, object] = {"nprocPerNode": str(spec.nproc_per_node)}
    if spec.elastic:
        backend = spec.rdzv_backend if spec.rdzv_backend != "static" else "c10d"
        args = [
            "--num_machines", spec.machines_text, "--rdzv_backend", k8s_literal(backend, "--rdzv_backend"),
            "--main_process_ip", f"{name}-worker-0", "--main_process_port", str(port), *common,
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
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "accelerando"}},
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
        ValueError: as :func:`pytorchjob_manifest`.
    """
    import yaml

    manifest = pytorchjob_manifest(spec, image)
    body = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
    return (
        "# Kubeflow PyTorchJob written by `accelerando launch --emit kubernetes`; `kubectl apply -f FILE`.\n"
        + body
    )

"""Job files for cluster schedulers, written from the settings of a launch.

``accelerando launch --emit slurm|kubernetes|ray [flags] script.py`` resolves its settings as a launch
does (defaults < config file < environment < flags) and, instead of starting processes, writes a job
that starts them on a cluster: an sbatch script (:mod:`.slurm`) or a Kubeflow ``PyTorchJob``
manifest (:mod:`.kubernetes`); or a Ray job's entrypoint (:mod:`.ray`, one ``accelerando launch
--ray`` on the head node, which places every process on the cluster). The first two run one
``accelerando launch`` per machine, which starts that machine's processes; the machine's rank and the rendezvous address come from the scheduler when the
job runs, every other setting some layer set is carried in the job (as flags or ``ACCELERANDO_*``
variables, which win over a config file), so the cluster needs no copy of the config file.

:func:`job_spec` computes what both formats share (:class:`JobSpec`); :func:`emit_job` renders one.
Nothing here imports torch or yaml at module level.
"""

from __future__ import annotations

from pathlib import Path

from accelerando.core.settings.resolve import Settings
from accelerando.launchers.emit.kubernetes import render_manifest
from accelerando.launchers.emit.ray import render_ray_job
from accelerando.launchers.emit.slurm import render_sbatch
from accelerando.launchers.emit.spec import TOPOLOGY_SETTINGS, JobSpec, job_spec, value_text
from accelerando.launchers.plan import Command

__all__ = ["EMIT_FORMATS", "JobSpec", "TOPOLOGY_SETTINGS", "emit_job", "job_spec", "value_text", "write_job"]

#: The formats ``--emit`` knows.
EMIT_FORMATS = ("slurm", "kubernetes", "ray")


def emit_job(settings: Settings, command: Command) -> str:
    """Render the job ``settings.emit`` names for a launch of ``command``.

    Args:
        settings: the launcher's resolved settings; ``emit`` is ``"slurm"``, ``"kubernetes"`` or ``"ray"``.
        command: what each process runs.

    Returns:
        The job file's text: an sbatch script, a ``PyTorchJob`` manifest in YAML, or a Ray job's
        entrypoint script.

    Raises:
        ValueError: an unknown format, impossible settings, or (kubernetes) no ``--emit_image``.
    """
    spec = job_spec(settings, command)
    if settings.emit == "slurm":
        return render_sbatch(spec)
    if settings.emit == "kubernetes":
        return render_manifest(spec, settings.emit_image)
    if settings.emit == "ray":
        return render_ray_job(spec)
    raise ValueError(
        f"--emit {settings.emit!r} is not a job format. Fix: use one of {', '.join(EMIT_FORMATS)}."
    )


def write_job(text: str, path: str | None) -> str:
    """Write a job file (executable for a script), or return ``text`` to print when ``path`` is None.

    Args:
        text: the rendered job.
        path: ``--emit_to``, or ``None``.

    Returns:
        A sentence saying where the job went (for the user), or the text itself when not written.

    Raises:
        OSError: the file cannot be written.
    """
    if path is None:
        return text
    target = Path(path).expanduser()
    target.write_text(text, encoding="utf-8")
    if text.startswith("#!"):
        target.chmod(target.stat().st_mode | 0o111)
    return f"wrote {target}"

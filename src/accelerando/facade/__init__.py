"""The services the Accelerator facade composes, one concern each.

``registry`` (prepared and registered objects), ``preparer`` (``prepare`` and ``prepare_*``),
``checkpoint_service`` (save / load and hooks), ``collectives`` (gather, reduce, process order),
``observing`` (trackers, memory monitor, profiler), ``topology`` (mesh ranks), ``accumulation``
(the per-micro-batch context); ``options`` normalises the constructor's arguments and
``delegation`` writes the Accelerator's one-line delegations. Each service receives what it needs
in its constructor; none makes a backend decision (those belong to the connector and the strategies).
"""

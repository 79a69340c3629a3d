"""Run models bigger than one device: empty initialisation, device maps, hooks, offload, loading, dispatch.

Typical flow::

    with init_empty_weights():
        model = MyModel(config)            # allocates nothing
    model = load_checkpoint_and_dispatch(model, "ckpt/", device_map="auto", offload_folder="off/")

The package is split by responsibility; each module imports only the ones listed before it, so
there are no import cycles:

- ``sizes``: byte sizes of modules and tensors.
- ``budgets``: memory budgets per device (size strings, device keys, free memory, balancing).
- ``tensors``: place, tie and walk the tensors of a model.
- ``device_map``: :func:`infer_auto_device_map`, which decides where each module lives.
- ``offload``: weights kept on CPU or on disk (memory-mapped), and the mappings that read them.
- ``hooks``: :class:`ModelHook` and the hooks run around a module's forward.
- ``attach``: attach hooks to a whole model and chain the offloading ones for prefetching.
- ``dispatch``: :func:`dispatch_model`, :func:`cpu_offload`, :func:`disk_offload`.
- ``broadcast`` and ``loading``: :func:`load_checkpoint_in_model`, :func:`load_checkpoint_and_dispatch`.
- ``empty_init``: :func:`init_empty_weights`, :func:`init_on_device`.

This namespace exports the public names of the reference's ``big_modeling`` module, resolved lazily
(PEP 562) so that importing one submodule does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.core._lazy import lazy_getattr

_EXPORTS: dict[str, str] = {
    "attach_layerwise_casting_hooks": "accelerando.big_modeling.attach",
    "cpu_offload": "accelerando.big_modeling.dispatch",
    "cpu_offload_with_hook": "accelerando.big_modeling.dispatch",
    "disk_offload": "accelerando.big_modeling.dispatch",
    "dispatch_model": "accelerando.big_modeling.dispatch",
    "init_empty_weights": "accelerando.big_modeling.empty_init",
    "init_on_device": "accelerando.big_modeling.empty_init",
    "load_checkpoint_and_dispatch": "accelerando.big_modeling.loading",
    "load_checkpoint_in_model": "accelerando.big_modeling.loading",
}

__all__ = list(_EXPORTS)

# Names the old single-module ``big_modeling.py`` imported at module level, so code could import them
# from here; they stay resolvable but are not part of ``__all__``.
_IMPORTABLE: dict[str, str] = {
    "_refuse_recurrent_layers_under_sequence_parallelism": "accelerando.big_modeling.model_info",
    "AlignDevicesHook": "accelerando.big_modeling.hooks",
    "CpuOffload": "accelerando.big_modeling.hooks",
    "UserCpuOffloadHook": "accelerando.big_modeling.hooks",
    "add_hook_to_module": "accelerando.big_modeling.hooks",
    "attach_align_device_hook": "accelerando.big_modeling.attach",
    "attach_align_device_hook_on_blocks": "accelerando.big_modeling.attach",
    "link_prefetch": "accelerando.big_modeling.attach",
    "check_tied_parameters_on_same_device": "accelerando.big_modeling.tensors",
    "find_tied_parameters": "accelerando.big_modeling.tensors",
    "to_torch_device": "accelerando.big_modeling.tensors",
    "get_balanced_memory": "accelerando.big_modeling.budgets",
    "normalize_device_key": "accelerando.big_modeling.budgets",
    "infer_auto_device_map": "accelerando.big_modeling.device_map",
    "check_device_map": "accelerando.big_modeling.device_map",
    "OffloadedWeightsLoader": "accelerando.big_modeling.offload",
    "offload_state_dict": "accelerando.big_modeling.offload",
    "offload_weight": "accelerando.big_modeling.offload",
    "save_offload_index": "accelerando.big_modeling.offload",
}

__getattr__ = lazy_getattr(__name__, {**_EXPORTS, **_IMPORTABLE}, globals(), submodules=True)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - static analysers only
    from accelerando.big_modeling.attach import attach_layerwise_casting_hooks  # noqa: F401
    from accelerando.big_modeling.dispatch import (  # noqa: F401
        cpu_offload,
        cpu_offload_with_hook,
        disk_offload,
        dispatch_model,
    )
    from accelerando.big_modeling.empty_init import init_empty_weights, init_on_device  # noqa: F401
    from accelerando.big_modeling.loading import (  # noqa: F401
        load_checkpoint_and_dispatch,
        load_checkpoint_in_model,
    )

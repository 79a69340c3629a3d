"""DataLoaderConfiguration: how ``Accelerator.prepare`` shards, dispatches and resumes dataloaders."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DataLoaderConfiguration"]


@dataclass
class DataLoaderConfiguration:
    """Settings of the dataloaders that ``Accelerator.prepare`` creates.

    Args:
        split_batches: Cut each batch of the original loader between the processes (its batch size
            is then the global one and must be a multiple of the number of processes). When False,
            every process gets whole batches of the original size.
        dispatch_batches: Read the data on the main process only and send each process its slice.
            None (default) dispatches for iterable datasets and shards map-style ones.
        even_batches: When the data does not divide into global batches, complete the last one with
            samples from the start so every process gets the same number of batches;
            ``Accelerator.gather_for_metrics`` drops the duplicates again.
        use_seedable_sampler: Shuffle with a ``SeedableRandomSampler`` whose order depends only on
            the seed and the epoch (reproducible across runs and resumes).
        data_seed: Seed of that sampler (default: the seed of ``set_seed``).
        non_blocking: Copy batches to the device asynchronously, one batch ahead (pinned memory).
        use_stateful_dataloader: Make ``load_state`` restore the position inside the epoch as well,
            so a resumed loop continues without calling ``skip_first_batches``.

    Raises:
        TypeError: When a flag is not a bool (or None for ``dispatch_batches``) or ``data_seed`` is
            not an integer.

    Example:
        >>> config = DataLoaderConfiguration(split_batches=True, even_batches=False)
        >>> config.dispatch_batches is None
        True
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "data_seed":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise TypeError(
                        f"DataLoaderConfiguration.data_seed must be an int or None, got {value!r}."
                    )
            elif not isinstance(value, bool) and not (value is None and field.name == "dispatch_batches"):
                raise TypeError(
                    f"DataLoaderConfiguration.{field.name} must be True or False, got {value!r}; "
                    f"pass e.g. {field.name}={field.default!r}."
                )

    def to_kwargs(self) -> dict[str, object]:
        """Return the settings as keyword arguments of ``prepare_data_loader``.

        Returns:
            A dict from field name to value.
        """
        return {field.name: getattr(self, field.name) for field in fields(self)}

"""The automatic layout asks a simulator when given one, and its reasons say what decided."""

from __future__ import annotations

from accelerando.core import parallelism_layout as pl

GIB = 1024**3
FACTS = pl.ModelFacts(
    num_parameters=7 * 10**9, num_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=4096
)
MACHINE = pl.MachineShape(num_nodes=1, devices_per_node=8, memory_per_device=80 * GIB)


def test_a_simulated_peak_replaces_the_formula_and_is_named_in_the_reason() -> None:
    asked: list[tuple[int, int, int, int]] = []

    def simulator(tp: int, pp: int, dp_shard: int, dp_replicate: int) -> int:
        asked.append((tp, pp, dp_shard, dp_replicate))
        # pretend only 8-way sharding fits, whatever the formula says
        return 10 * GIB if dp_shard == 8 else 100 * GIB

    layout = pl.choose_layout(FACTS, MACHINE, seq_length=4096, simulator=simulator)
    assert layout.sizes == (1, 1, 8, 1)
    assert layout.memory_per_device == 10 * GIB
    assert asked[0] == (1, 1, 1, 8) and asked[-1] == (1, 1, 8, 1)
    assert layout.reason[-1].endswith("[simulated peak]")
    assert any("simulated peak 100.0 GiB per device" in line for line in layout.reason)


def test_a_layout_the_simulator_does_not_run_falls_back_to_the_formula() -> None:
    without = pl.choose_layout(FACTS, MACHINE, seq_length=4096)
    layout = pl.choose_layout(FACTS, MACHINE, seq_length=4096, simulator=lambda *sizes: None)
    assert layout.sizes == without.sizes
    assert layout.reason[-1].endswith("[formula estimate: the simulator does not run this layout]")
    assert not without.reason[-1].endswith("]")

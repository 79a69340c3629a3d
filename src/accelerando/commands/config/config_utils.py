"""Small pieces shared by the ``accelerando config`` modules: the dynamo backend names and a help
formatter for commands with subcommands.
"""

from __future__ import annotations

import argparse

__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]

#: The torch.compile backends the reference's config questions offer (its list, spelling included).
DYNAMO_BACKENDS = [
    "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
    "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM",
]  # fmt: skip


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help formatter that lists subcommands one per line, without the ``{a,b,c}`` summary line.

    Descriptions keep their own line breaks.
    """

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        if action.nargs == argparse.PARSER:
            # The first line repeats every choice as "{a,b,c}"; the lines below already list them.
            text = "\n".join(text.split("\n")[1:])
        return text

"""mkdocs hook: generate ``reference/cli.md`` from the settings table at build time.

The page is never stored in ``docs/``: it is rendered from :data:`accelerando.settings.fields.FIELDS`
(and the launcher's own options) on every build, so a new setting row appears in the site without
anyone editing a page. :func:`render_cli_reference` is also used by the tests.
"""

from __future__ import annotations

import argparse
from typing import Any

PAGE = "reference/cli.md"


def _cell(text: str) -> str:
    """Escape a value for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _default(field: Any) -> str:
    if field.default is None:
        return "unset (detected)"
    if field.kind == "bool":
        return "`true`" if field.default else "`false`"
    return f"`{field.default}`"


def _flag(field: Any) -> str:
    if field.cli is None:
        return "(none)"
    flag = field.cli
    spellings = [flag]
    body = flag[2:]
    if "_" in body:
        spellings.append("--" + body.replace("_", "-"))
    value = "" if field.switch else f" {field.kind.upper()}"
    return "<br>".join(_code(s + value) for s in spellings)


def _allowed(field: Any) -> str:
    text = field.describe_allowed()
    if field.aliases:
        text += "; also " + ", ".join(f"{k!r} = {v!r}" for k, v in field.aliases.items())
    return text


def _launcher_options() -> list[tuple[str, str]]:
    """The launcher's own options (not settings): flag spellings and help."""
    from accelerando.commands.launch import build_parser

    parser = build_parser()
    rows: list[tuple[str, str]] = []
    for group in parser._action_groups:  # argparse has no public group listing
        if group.title != "Launcher":
            continue
        for action in group._group_actions:
            if action.help is argparse.SUPPRESS:
                continue
            rows.append((", ".join(action.option_strings), action.help or ""))
    return rows


def render_cli_reference() -> str:
    """Render the command-line reference page as Markdown.

    Returns:
        The page: the subcommands, the launcher's own options, then one table per settings group
        with every flag spelling, environment variable, config-file key, default, allowed values
        and help line.
    """
    from accelerando.commands.cli import HELP, SUBCOMMANDS
    from accelerando.commands.launch.parser import _GROUP_TITLES
    from accelerando.settings.fields import FIELDS, GROUPS

    out: list[str] = [
        "# Command line",
        "",
        "This page is generated at build time from the settings table "
        "(`src/accelerando/settings/fields.py`), the same table the launcher, the config-file "
        "validator and the resolver are built from, so it cannot drift from the code.",
        "",
        "## Subcommands",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    out += [f"| `accelerando {name}` | {_cell(HELP.get(name, ''))} |" for name in SUBCOMMANDS]
    out += [
        "",
        "Each multi-word flag takes both spellings, `--num_processes` and `--num-processes`.",
        "",
        "## Launcher options",
        "",
        "These belong to `accelerando launch` itself and are not settings.",
        "",
        "| flag | what it does |",
        "| --- | --- |",
    ]
    out += [f"| {_code(flags)} | {_cell(help_)} |" for flags, help_ in _launcher_options()]
    out += [
        "",
        "## Settings",
        "",
        "Every setting below resolves with the precedence *argument in code > launcher flag > "
        "environment variable > config file > default* "
        "(see [Settings and where they come from](../concepts/settings.md)). "
        "The environment column lists the variables in the order they are read: ours first, "
        "then the reference's names.",
        "",
    ]
    for group in GROUPS:
        fields = [f for f in FIELDS if f.group == group]
        out += [f"### {_GROUP_TITLES.get(group, group.capitalize())}", ""]
        out += [
            "| setting | flag | environment | config key | default | allowed | help |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for f in fields:
            env = "<br>".join(_code(name) for name in f.env_names)
            keys = "<br>".join(_code(k) for k in f.config_keys) or "(environment / code only)"
            out.append(
                f"| `{f.name}` | {_flag(f)} | {env} | {keys} | {_default(f)} | "
                f"{_cell(_allowed(f))} | {_cell(f.help)} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """Add the generated CLI reference page to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_cli_reference()))
    return files

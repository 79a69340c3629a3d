"""mkdocs hook: generate ``reference/cli.md`` from the settings table at build time.

The page is never stored in ``docs/``: it is rendered from :data:`accelerando.core.settings.fields.FIELDS`
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


def _term(field: Any) -> str:
    """The definition-list term: the flag with its value (or the setting, when it has no flag)."""
    from accelerando.commands.launch.parser import _METAVARS

    if field.cli is None:
        return f'`{field.name}` <span class="cli-note">no flag: environment, config file or code</span> {{ .cli-term }}'
    value = "" if field.switch else " " + _METAVARS.get(field.name, field.kind.upper())
    return f"`{field.cli}{value}` {{ .cli-term }}"


def _allowed(field: Any) -> str:
    text = field.describe_allowed()
    if field.aliases:
        text += "; also " + ", ".join(f"{k!r} = {v!r}" for k, v in field.aliases.items())
    return text


def _definition(field: Any) -> list[str]:
    """One setting as a definition-list entry: what it does, then where it can be set.

    ``.cli-term`` / ``.cli-where`` (``docs/stylesheets/cli.css``) keep names in code unbroken. The
    setting's own name is shown only where it differs from its flag.
    """
    env = ", ".join(_code(name) for name in field.env_names)
    keys = ", ".join(_code(k) for k in field.config_keys) or "none (environment or code only)"
    name = f" · **setting** `{field.name}`" if field.cli not in (None, f"--{field.name}") else ""
    return [
        _term(field),
        f":   {field.help}",
        "",
        f"    **Default** {_default(field)} · **values** {_allowed(field)}{name}  ",
        f"    **Environment** {env}  ",
        f"    **Config key** {keys}",
        "    { .cli-where }",
        "",
    ]


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
        The page: the subcommands, the launcher's own options, then one section per settings group
        with one definition-list entry per setting (its flag, what it does, its default and allowed
        values, its environment variables and config-file keys). Definition lists rather than wide
        tables, so that long names never wrap mid-word and nothing is cut on a laptop screen.
    """
    from accelerando.commands.cli import HELP, SUBCOMMANDS
    from accelerando.commands.launch.parser import _GROUP_TITLES
    from accelerando.core.settings.fields import FIELDS, GROUPS

    out: list[str] = [
        "# Command line",
        "",
        "This page is generated at build time from the settings table "
        "(`src/accelerando/core/settings/fields.py`), the same table the launcher, the config-file "
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
        "`accelerando <command> --help` lists a command's own options.",
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
        "Each setting is a flag of `accelerando launch`, an environment variable and (mostly) a "
        "config-file key. They resolve with the precedence *argument in code > launcher flag > "
        "environment variable > config file > default* "
        "(see [Settings and where they come from](../concepts/settings.md)). "
        "Environment variables are listed in the order they are read: ours first, then the "
        "reference's names. Each multi-word flag takes both spellings, `--num_processes` and "
        "`--num-processes`.",
        "",
    ]
    for group in GROUPS:
        fields = [f for f in FIELDS if f.group == group]
        out += [f"### {_GROUP_TITLES.get(group, group.capitalize())}", ""]
        for f in fields:
            out += _definition(f)
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """Add the generated CLI reference page to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_cli_reference()))
    return files

"""Each setting is defined once (settings.Settings): --help, the README and docs/cli.md agree with it."""
import ast
import re
from pathlib import Path

import pytest

from agent_demo_kit.cli import build_parser, environment_help
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.settings import Settings, load_settings, setting_fields, shown_default

ROOT = Path(__file__).resolve().parent.parent
LOCAL = "http://127.0.0.1:9/v1"  # a local server needs no key
WITH_FLAGS = [item for item in setting_fields() if item.metadata["flag"]]
WITH_VARIABLES = [item for item in setting_fields() if item.metadata["variables"]]


def table(path: Path, header: str) -> dict:
    """The rows of the markdown table whose header row starts with `header`: first cell -> cells."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def flag_row(rows: dict, flag: str) -> list:
    """The row whose first cell names the flag (`--max-rounds N`, `-m`, `--model NAME`, `--stream`, ...)."""
    [row] = [cells for first, cells in rows.items() if re.search(rf"`{re.escape(flag)}[` ]", first)]
    return row


def plain(cell: str) -> str:
    return cell.replace("`", "").strip()


@pytest.mark.parametrize("item", WITH_VARIABLES, ids=lambda item: item.name)
def test_the_cli_docs_list_each_variable_with_its_default(item):
    rows = table(ROOT / "docs" / "cli.md", "| variable | default |")
    variable = item.metadata["variables"][0]
    assert plain(rows[f"`{variable}`"][0]) == shown_default(item)


@pytest.mark.parametrize("item", WITH_FLAGS, ids=lambda item: item.name)
def test_the_cli_docs_list_each_flag_with_its_default(item):
    flag, variables = item.metadata["flag"], item.metadata["variables"]
    docs = plain(re.sub(r"\(`[A-Z_]+`\)", "", flag_row(table(ROOT / "docs" / "cli.md", "| flag | default |"),
                                                         flag)[0]))
    assert docs in (shown_default(item), *variables), f"docs/cli.md: {flag} says {docs}"


def test_every_flag_the_parser_takes_is_in_the_cli_docs():
    rows = table(ROOT / "docs" / "cli.md", "| flag | default |")
    listed = " ".join(rows)
    flags = {flag for action in build_parser()._actions for flag in action.option_strings}
    missing = sorted(flag for flag in flags if not re.search(rf"`{re.escape(flag)}[`\[ ,=]", listed))
    assert missing == []


def test_help_shows_each_flag_and_variable_with_the_default_of_its_definition():
    actions = {flag: action for action in build_parser()._actions for flag in action.option_strings}
    for item in WITH_FLAGS:
        help_text = actions[item.metadata["flag"]].help
        assert help_text.startswith(item.metadata["help"]) and f"default {shown_default(item)})" in help_text
        assert all(variable in help_text for variable in item.metadata["variables"])
    variables = environment_help()
    for item in WITH_VARIABLES:
        assert re.search(rf"^  {item.metadata['variables'][0]} +\S.*\({'default ' if item.name in ('url', 'model') else ''}"
                         rf"{re.escape(shown_default(item))}\)$", variables, re.M) or item.name == "api_key"


def test_no_function_restates_a_settings_default():
    """max_calls=8, mode="json", tool_timeout=60.0 in a signature would be a second owner of the default."""
    names = {item.name for item in setting_fields()}
    restated = []
    for path in [ROOT / "agent_demo.py", ROOT / "tools.py", ROOT / "prompts.py", *(ROOT / "agent_demo_kit").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + \
                    node.args.kw_defaults
                restated += [f"{path.name}:{node.name}({argument.arg}=...)" for argument, default
                             in zip(arguments, defaults) if argument.arg in names and isinstance(default, ast.Constant)
                             and default.value is not None]
    assert restated == []


def test_settings_cannot_change_once_loaded():
    settings = load_settings({"max_rounds": 3, "url": LOCAL}, {})
    with pytest.raises(AttributeError):
        settings.max_rounds = 4
    assert (settings.max_rounds, settings.sources["max_rounds"]) == (3, "--max-rounds")


@pytest.mark.parametrize("given, environment, said", [
    ({"max_rounds": "3"}, {}, None),
    ({"max_rounds": 2.5}, {}, "--max-rounds must be a whole number, got '2.5'"),
    ({"yes": "no"}, {}, "--yes must be True or False, got 'no'"),
    ({"max_rounds": [3]}, {}, "--max-rounds must be a number, got [3]"),
    ({"model": 5}, {}, "--model must be a string, got 5"),
    ({"tools_files": "a.py"}, {}, "--tools-file must be a list of strings, got 'a.py'"),
    ({}, {"AGENT_TIMEOUT": "nan"}, "AGENT_TIMEOUT must be a number of seconds more than 0"),
    ({}, {"AGENT_MAX_CALLS": "0"}, "AGENT_MAX_CALLS must be at least 1, got 0"),
])
def test_a_flag_a_keyword_and_a_variable_go_through_the_same_check(given, environment, said):
    if said is None:
        assert load_settings({**given, "url": LOCAL}, environment).max_rounds == 3
        return
    with pytest.raises(ConfigError) as raised:
        load_settings({**given, "url": LOCAL}, environment)
    assert str(raised.value).startswith(said)


def test_the_defaults_need_nothing_given():
    assert Settings().endpoint == "https://api.openai.com/v1/chat/completions"
    assert Settings(url="http://127.0.0.1:8080/v1/").endpoint == "http://127.0.0.1:8080/v1/chat/completions"


def test_config_does_not_list_a_dot_env_it_refused_as_read(tmp_path, capsys):
    from agent_demo_kit.cli import main
    (tmp_path / ".env").write_text("LLM_MODEL=from-dotenv\n")
    (tmp_path / ".env").chmod(0o666)
    assert main(["--config"]) == 0
    out = capsys.readouterr().out
    assert f"not read: {tmp_path / '.env'}" in out and "from-dotenv" not in out
    (tmp_path / ".env").chmod(0o644)
    assert main(["--config"]) == 0
    assert f"\nread: {tmp_path / '.env'}" in capsys.readouterr().out

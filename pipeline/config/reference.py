"""The configuration reference (docs/reference.md), generated from the typed schema.

Every key of :mod:`pipeline.config.job` and :mod:`pipeline.config.schema` by group: its type,
default and comment (the comment on its line and the comment lines right above it), after the
group's docstring; then each group's shipped options (``pipeline/conf/<group>/*.yaml``) and
what they set. The docstrings' and comments' reST markup (roles, double backticks) becomes
Markdown's single backticks on the page, and a short section on the input formats comes first.
``python -m pipeline.config.reference > docs/reference.md`` regenerates the page;
``tests/test_docs.py`` fails when the page differs from what this prints.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path

import yaml

SCHEMA = [Path(__file__).with_name(name) for name in ("job.py", "schema.py")]
CONF = Path(__file__).resolve().parents[1] / "conf"
# (key prefix, dataclass, shipped option group or None), in the order of the page
GROUPS = [
    ("job", "JobConfig", "job"), ("job.sampling", "SamplingConfig", None), ("job.rag", "RagConfig", None),
    ("model", "ModelConfig", "model"), ("cluster", "ClusterConfig", "cluster"), ("pools", "PoolsConfig", "pools"),
    ("transport", "TransportConfig", "transport"), ("offload", "OffloadConfig", "offload"), ("run", "RunConfig", None),
]


# a Sphinx role (:mod:`x`, :class:`~x`) or a reST literal (``x``): Markdown's `x` on the page
_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj|exc):`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")


def _plain(text: str) -> str:
    """A docstring's or comment's text as Markdown: reST roles and double backticks to `x`."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", text))


# what an option's `name` key means where its line has no comment
NAMES = {"model": "the model's name (set by the option config) in messages and plans; a bundled model "
                  "(`source`) is converted into the cache under it"}

# what `job.input` reads (pipeline/io/formats.py: EXTENSIONS), before the groups
INPUT_FORMATS = [
    "## Input formats",
    "",
    "`job.input` names a folder (searched recursively), a glob or one file, local or any fsspec URL.",
    "Each shard is read by its extension, and one input may mix them; every output shard is Parquet.",
    "",
    "| file | read as | the prompt comes from |",
    "|---|---|---|",
    "| `*.parquet` (or no extension) | Parquet, in row groups | `job.text_column` (or `job.messages_column`) |",
    "| `*.jsonl`, `*.json`, `*.ndjson` | JSON Lines: one JSON object a line | the same columns, as keys |",
    "| `*.csv` | CSV: a header line, then one record a row | the same columns, by the header |",
    "| `*.jsonl` of OpenAI batch requests | an OpenAI batch file (`custom_id`, `url`, `body`): it also writes `NAME.jsonl` of responses | each request's `body`; the job's column and template settings do not apply |",
    "",
    "A file named with another extension (`.txt`, `.tsv`) is refused at start; in a folder such files",
    "are skipped. A JSON Lines or CSV line that is not a row is an error row naming the line. Details:",
    "[input formats](running.md#input-formats-parquet-json-lines-csv),",
    "[OpenAI batch files](sampling.md#openai-batch-files).",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _default(node: ast.expr | None) -> str:
    """How a field's default reads in the table."""
    if node is None:
        return "required"
    if isinstance(node, ast.Name) and node.id == "MISSING":
        return "required"
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        factory = next((k.value for k in node.keywords if k.arg == "default_factory"), None)
        if isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
            return "`[]`" if factory.id == "list" else "`{}`"
        if isinstance(factory, ast.Name):
            return "(the group below)"
        return "`{}`"  # lambda: OmegaConf.create({}, ...): an open, empty dict
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return f"`{ast.unparse(node)}`"
    return f"`{_yaml(value)}`"


def _yaml(value: object) -> str:
    """A value as it is written in YAML (``null``, ``true``, ``'text'``); JSON text for a
    string with a line break."""
    if isinstance(value, str) and "\n" in value:
        return json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _comment(lines: list[str], lineno: int) -> str:
    """The comment on line ``lineno`` (1-based) after the code, and the comment lines above it."""
    above = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        above.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    line = lines[lineno - 1]
    after = line.split("  # ", 1)[1].strip() if "  # " in line else ""
    return " ".join(part for part in (" ".join(above), after) if part)


def _classes() -> dict[str, tuple[ast.ClassDef, list[str]]]:
    """Each schema class by name, with the lines of its file (for the comments)."""
    out = {}
    for path in SCHEMA:
        text = path.read_text()
        out.update({n.name: (n, text.splitlines()) for n in ast.parse(text).body if isinstance(n, ast.ClassDef)})
    return out


def _fields(cls: ast.ClassDef, lines: list[str]) -> list[tuple[str, str, str, str]]:
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append((node.target.id, ast.unparse(node.annotation), _default(node.value), _comment(lines, node.lineno)))
    return out


def _flat(data: object, prefix: str = "") -> list[str]:
    if isinstance(data, dict) and data:
        return [s for k, v in data.items() for s in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    return [f"{prefix}={_yaml(data)}"]


def _options(group: str) -> list[str]:
    rows = ["| option | what it sets |", "|---|---|"]
    for path in sorted((CONF / group).glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        extends = [d for d in data.pop("defaults", []) if d not in ("_self_", "schema")]
        sets = ", ".join(f"`{s}`" for s in _flat(data))
        if extends:
            sets = f"extends {', '.join(f'`{e}`' for e in extends)}; " + sets
        name = f"`+job={path.stem}`" if group == "job" else f"`{group}={path.stem}`"
        rows.append(f"| {name} | {_cell(sets)} |")
    return rows


def reference() -> str:
    """The whole page, Markdown."""
    classes = _classes()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m pipeline.config.reference > docs/reference.md` from",
        "pipeline/config/job.py, schema.py and pipeline/conf/; edit those, not this page. -->",
        "",
        "Every key of the typed schema, by group: type, default, and what it means. Set any of them on",
        "the command line (`key=value`), in a config of your own (see [installing](install.md)), or",
        "from Python (`submit(\"key=value\", ...)`). A key that is not here, or a value of the wrong",
        "type, is refused at start (exit 2). `required`: the job or option config must set it.",
        "",
        "Groups: " + ", ".join(f"[`{p}`](#{p.replace('.', '')})" for p, _, _ in GROUPS) + ".",
        "",
        *INPUT_FORMATS,
    ]
    for prefix, name, group in GROUPS:
        cls, lines = classes[name]
        out += ["", f"## {prefix}", ""]
        doc = ast.get_docstring(cls)
        if doc:
            out += [_plain(inspect.cleandoc(doc)), ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, typ, default, comment in _fields(cls, lines):
            if key == "name" and group is not None:
                comment = comment or NAMES.get(group, "the option's name (set by the option config): a label")
            out.append(f"| `{prefix}.{key}` | `{_cell(typ)}` | {_cell(default)} | {_cell(_plain(comment))} |")
        if group is not None:
            chosen = "(none: `+job=NAME` picks one)" if group == "job" else ""
            out += ["", f"Shipped options of `{group}` {chosen}".rstrip() + ":", ""] + _options(group)
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())

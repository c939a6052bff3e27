"""A YAML list read entry by entry, so that one entry's YAML problem costs only that entry, and a file of
a few hundred bytes cannot make its reader expand gigabytes (an alias bomb).

- Aliases: `BoundedLoader` lets the file's aliases expand to at most `MAX_ALIAS_NODES` nodes in all
  (an alias counts the nodes of what it names, aliases inside included; `<<: *defaults` merges cost a
  few dozen). An alias past that budget, an undefined one, or one inside the node it names is refused:
  the entry holding it is left out with that problem, the other entries keep their aliases.
- Construction: each top-level item is constructed on its own, so an unknown tag
  (`!!python/object:...`) or a bad timestamp costs only its entry.
- Syntax errors: when the document does not parse, each top-level item (a line starting with `- ` at
  column 0, up to the next one) is parsed alone; the items that do not parse are replaced by `- ~` and
  the document parsed again, so anchors defined in the good items still work. When that does not
  parse either (the error is outside the items, or only items together break it), the whole file is
  the problem: `YamlFileError`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_ALIAS_NODES = 100_000
NULL_TAG = "tag:yaml.org,2002:null"


class YamlFileError(ValueError):
    """The document as a whole is unusable; the message says what and at which line."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One item of the top-level list: its 1-based number, and its value or why it has none."""

    number: int
    value: Any = None
    problem: str | None = None
    node: Node | None = None  # what was composed, to read a name from when the value could not be built


def _at(mark: Any, line_offset: int = 0) -> str:
    return f" at line {mark.line + 1 + line_offset}, column {mark.column + 1}" if mark else ""


def _describe(exc: yaml.YAMLError, what: str = "YAML error", line_offset: int = 0,
              last_line: int | None = None) -> str:
    """One line: what, where, and the parser's words (and where the construct it was in began).
    `line_offset`: the lines before the text parsed; `last_line`: its last line, for an error found
    past its end (an unclosed bracket)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{what}: {exc}"
    mark = exc.problem_mark or exc.context_mark
    at = _at(mark, line_offset)
    if last_line is not None and mark and mark.line + line_offset >= last_line:
        at = f" at the end of the entry (line {last_line})"
    context = exc.context_mark
    started = (f" ({exc.context}{_at(context, line_offset)})" if exc.problem and exc.context and context
               and (context.line, context.column) != (mark.line, mark.column) else "")
    return f"{what}{at}: {exc.problem or exc.context}{started}"


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose aliases expand to at most MAX_ALIAS_NODES nodes in all; a refused alias is
    composed as a null scalar and the nodes holding it are listed in `refused` with the reason."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.expanded = 0
        self.sizes: dict[Node, int] = {}  # node -> its node count with aliases expanded
        self.refused: dict[Node, str] = {}  # node -> the first refused alias inside it

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            return self._compose_alias()
        node = super().compose_node(parent, index)
        children = ([part for pair in node.value for part in pair] if isinstance(node, MappingNode)
                    else node.value if isinstance(node, SequenceNode) else [])
        self.sizes[node] = 1 + sum(self.sizes[child] for child in children)
        why = next((self.refused[child] for child in children if child in self.refused), None)
        if why:
            self.refused[node] = why
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError) as exc:  # a scalar the safe constructors cannot build: say where
            kind = node.tag.rsplit(":", 1)[-1]
            what = f"{node.value!r} as {kind}" if isinstance(node, ScalarNode) else f"the {kind}"
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {what}: {exc}", node.start_mark) from exc

    def _compose_alias(self) -> Node:
        event = self.get_event()
        target = self.anchors.get(event.anchor)
        size = self.sizes.get(target) if target is not None else None
        if target is None:
            why = f"undefined alias *{event.anchor}"
        elif size is None:  # still being composed: the alias is inside what it names
            why = f"alias *{event.anchor} is inside the node it names"
        elif self.expanded + size > MAX_ALIAS_NODES:
            why = (f"alias *{event.anchor} would make the file's aliases expand to more than "
                   f"{MAX_ALIAS_NODES} nodes (an alias bomb?)")
        else:
            self.expanded += size
            return target
        refused = ScalarNode(NULL_TAG, "", event.start_mark, event.end_mark)
        self.sizes[refused] = 1
        self.refused[refused] = f"YAML alias refused{_at(event.start_mark)}: {why}"
        return refused


def _items(lines: list[str]) -> list[range]:
    """The line ranges of the top-level block list's items: from a `- ` line at column 0 to the next."""
    starts = [n for n, line in enumerate(lines) if line.startswith("- ") or line.rstrip("\r\n") == "-"]
    return [range(start, end) for start, end in zip(starts, starts[1:] + [len(lines)])]


def _unparsable_items(text: str) -> tuple[str, dict[int, str]]:
    """The text with every item that does not parse on its own replaced by `- ~` (same line numbers),
    and those items' syntax errors by their first line."""
    lines = text.splitlines(keepends=True)
    broken: dict[int, str] = {}
    for item in _items(lines):
        try:
            for _ in yaml.parse("".join(lines[item.start:item.stop]), Loader=yaml.SafeLoader):
                pass
        except yaml.YAMLError as exc:
            broken[item.start] = _describe(exc, "YAML syntax error", item.start, item.stop)
            lines[item.start:item.stop] = ["- ~\n"] + ["\n"] * (len(item) - 1)
    return "".join(lines), broken


def _compose(text: str) -> tuple[BoundedLoader, Node | None]:
    loader = BoundedLoader(text)
    try:
        return loader, loader.get_single_node()
    finally:
        loader.dispose()


def _compose_salvaging(text: str) -> tuple[BoundedLoader, Node | None, dict[int, str]]:
    """The composed document and the syntax errors of the items left out to compose it."""
    try:
        return *_compose(text), {}
    except RecursionError:
        raise YamlFileError("YAML nested too deeply") from None
    except yaml.YAMLError as exc:
        salvaged, broken = _unparsable_items(text)
        try:
            if broken:
                return *_compose(salvaged), broken
        except (yaml.YAMLError, RecursionError):
            pass
        raise YamlFileError(_describe(exc, "YAML syntax error")) from None


def _construct(loader: BoundedLoader, node: Node) -> Any:
    """The node's value, built alone (a construction error costs only this node)."""
    loader.constructed_objects, loader.recursive_objects, loader.state_generators = {}, {}, []
    return loader.construct_document(node)


def _kind_name(loader: BoundedLoader, node: Node) -> str:
    """The Python type name a node stands for (mappings and lists without building them)."""
    if isinstance(node, MappingNode):
        return "dict"
    if isinstance(node, SequenceNode):
        return "list"
    try:
        return type(_construct(loader, node)).__name__
    except yaml.YAMLError:
        return "scalar"


def scalar_of(node: Node | None, key: str) -> str | None:
    """The plain string value of `key` in a mapping node, read without constructing it."""
    if not isinstance(node, MappingNode):
        return None
    return next((v.value for k, v in node.value if isinstance(k, ScalarNode) and k.value == key
                 and isinstance(v, ScalarNode) and v.tag == "tag:yaml.org,2002:str"), None)


def read_list(text: str, noun: str, wrapper: str | None = None) -> list[Entry] | None:
    """The entries of a YAML document that is a list of `noun` (or `{wrapper: list}`); None for an
    empty document. Raises YamlFileError for a document that is not a list or cannot be salvaged."""
    loader, root, broken = _compose_salvaging(text)
    if root is None:
        return None
    if (wrapper and isinstance(root, MappingNode) and len(root.value) == 1
            and isinstance(root.value[0][0], ScalarNode) and root.value[0][0].value == wrapper):
        root = root.value[0][1]
    if not isinstance(root, SequenceNode):
        raise YamlFileError(f"expected a YAML list of {noun}, got {_kind_name(loader, root)}")
    return [_entry(loader, number, node, broken) for number, node in enumerate(root.value, start=1)]


def _entry(loader: BoundedLoader, number: int, node: Node, broken: dict[int, str]) -> Entry:
    line = node.start_mark.line
    if line in broken and node.tag == NULL_TAG:
        return Entry(number, problem=broken[line])
    if node in loader.refused:
        return Entry(number, problem=loader.refused[node], node=node)
    try:
        return Entry(number, value=_construct(loader, node), node=node)
    except yaml.YAMLError as exc:
        return Entry(number, problem=_describe(exc), node=node)
    except RecursionError:
        return Entry(number, problem=f"YAML nested too deeply at line {line + 1}", node=node)

"""Code navigation with tree-sitter: where a symbol is defined (find_definition) and used (find_references).

Candidate files are the ones ripgrep finds containing the symbol as a whole word; only those
are parsed. Definitions come from each grammar's bundled `queries/tags.scm`, extended with a few
patterns of our own for what it leaves out (methods, fields, variables, enums, macros...).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from tree_sitter import Language, Node, Parser, Query, QueryCursor, Tree

from .lsp import for_model
from .process import find_binary, run_process
from .registry import PATH, Tool, ToolContext, ToolFailure, ToolOutput, tool
from .workspace_paths import relative_to_workspace, resolve_in_workspace

if TYPE_CHECKING:
    from .lsp.client import LanguageServer

LanguageName = Literal["python", "javascript", "typescript", "go", "rust", "java", "c", "cpp"]

_RG_TIMEOUT_S = 60.0
_RG_MAX_OUTPUT_BYTES = 50_000_000
_MAX_SOURCE_BYTES = 2_000_000
_MAX_LINE_CHARS = 200
_TRUNCATION_HINT = "narrow `path` or set `language` to see the rest"


@dataclass(frozen=True)
class _Grammar:
    """One tree-sitter grammar: the files it parses and the tags query used on them.

    The query is `before` + the bundled tags.scm of each module in `tags_from` + `after`. When
    several patterns name the same definition, the earliest wins, so `before` refines tags.scm
    (a function inside a class is a method) and `after` only adds what tags.scm misses.
    """

    name: str
    language: LanguageName
    module: str
    entry: str
    extensions: tuple[str, ...]
    tags_from: tuple[str, ...]
    before: str = ""
    after: str = ""


_PYTHON_METHODS = """
(class_definition body: (block (function_definition name: (identifier) @name) @definition.method))
(class_definition body: (block (decorated_definition
  definition: (function_definition name: (identifier) @name) @definition.method)))
"""
_PYTHON_FIELDS = """
(class_definition body: (block (expression_statement (assignment left: (identifier) @name) @definition.field)))
"""
_JS_MODULE_VARIABLES = """
(program [
  (lexical_declaration (variable_declarator name: (identifier) @name) @definition.variable)
  (variable_declaration (variable_declarator name: (identifier) @name) @definition.variable)
  (export_statement declaration: [
    (lexical_declaration (variable_declarator name: (identifier) @name) @definition.variable)
    (variable_declaration (variable_declarator name: (identifier) @name) @definition.variable)])
])
"""
_JS_FIELDS = "(field_definition property: (property_identifier) @name) @definition.field"
_TS_EXTRAS = """
(public_field_definition name: (property_identifier) @name) @definition.field
(type_alias_declaration name: (type_identifier) @name) @definition.type
(enum_declaration name: (identifier) @name) @definition.enum
"""
_GO_EXTRAS = """
(method_elem name: (field_identifier) @name) @definition.method
(var_spec name: (identifier) @name) @definition.variable
(const_spec name: (identifier) @name) @definition.constant
(field_declaration name: (field_identifier) @name) @definition.field
"""
_RUST_EXTRAS = """
(function_signature_item name: (identifier) @name) @definition.method
(const_item name: (identifier) @name) @definition.constant
(static_item name: (identifier) @name) @definition.variable
(field_declaration name: (field_identifier) @name) @definition.field
(enum_variant name: (identifier) @name) @definition.variant
"""
_JAVA_EXTRAS = """
(enum_declaration name: (identifier) @name) @definition.enum
(record_declaration name: (identifier) @name) @definition.class
(annotation_type_declaration name: (identifier) @name) @definition.interface
(constructor_declaration name: (identifier) @name) @definition.constructor
(field_declaration declarator: (variable_declarator name: (identifier) @name)) @definition.field
(constant_declaration declarator: (variable_declarator name: (identifier) @name)) @definition.constant
(enum_constant name: (identifier) @name) @definition.constant
"""
_C_EXTRAS = """
(preproc_def name: (identifier) @name) @definition.macro
(preproc_function_def name: (identifier) @name) @definition.macro
(translation_unit (declaration declarator: [
  (identifier) @name
  (init_declarator declarator: (identifier) @name)]) @definition.variable)
(field_declaration declarator: (field_identifier) @name) @definition.field
(enumerator name: (identifier) @name) @definition.constant
"""
_CPP_METHODS = """
(field_declaration_list (function_definition
  declarator: (function_declarator declarator: (field_identifier) @name)) @definition.method)
(field_declaration_list (field_declaration
  declarator: (function_declarator declarator: (field_identifier) @name)) @definition.method)
"""
_CPP_EXTRAS = (
    _C_EXTRAS
    + """
(namespace_definition name: (namespace_identifier) @name) @definition.module
(function_declarator declarator: (qualified_identifier name: [
  (identifier) @name
  (qualified_identifier name: [
    (identifier) @name
    (qualified_identifier name: (identifier) @name)])])) @definition.method
"""
)

_JS, _TS = "tree_sitter_javascript", "tree_sitter_typescript"
_GRAMMARS: dict[str, _Grammar] = {
    g.name: g
    for g in [
        _Grammar(
            "python", "python", "tree_sitter_python", "language", (".py", ".pyi"), ("tree_sitter_python",),
            before=_PYTHON_METHODS, after=_PYTHON_FIELDS,
        ),
        _Grammar(
            "javascript", "javascript", _JS, "language", (".js", ".mjs", ".cjs", ".jsx"), (_JS,),
            after=_JS_MODULE_VARIABLES + _JS_FIELDS,
        ),
        _Grammar(
            "typescript", "typescript", _TS, "language_typescript", (".ts", ".mts", ".cts"), (_JS, _TS),
            after=_JS_MODULE_VARIABLES + _TS_EXTRAS,
        ),
        _Grammar(
            "tsx", "typescript", _TS, "language_tsx", (".tsx",), (_JS, _TS),
            after=_JS_MODULE_VARIABLES + _TS_EXTRAS,
        ),
        _Grammar("go", "go", "tree_sitter_go", "language", (".go",), ("tree_sitter_go",), after=_GO_EXTRAS),
        _Grammar(
            "rust", "rust", "tree_sitter_rust", "language", (".rs",), ("tree_sitter_rust",), after=_RUST_EXTRAS
        ),
        _Grammar(
            "java", "java", "tree_sitter_java", "language", (".java",), ("tree_sitter_java",),
            after=_JAVA_EXTRAS,
        ),
        _Grammar("c", "c", "tree_sitter_c", "language", (".c", ".h"), ("tree_sitter_c",), after=_C_EXTRAS),
        _Grammar(
            "cpp", "cpp", "tree_sitter_cpp", "language", (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx"),
            ("tree_sitter_cpp",), before=_CPP_METHODS, after=_CPP_EXTRAS,
        ),
    ]
}  # fmt: skip
_BY_EXTENSION = {ext: g for g in _GRAMMARS.values() for ext in g.extensions}
_SUPPORTED = ", ".join(sorted(_BY_EXTENSION))


@functools.cache
def _compiled(grammar_name: str) -> tuple[Language, Query]:
    """The grammar's Language and tags Query, built once per process."""
    grammar = _GRAMMARS[grammar_name]
    language = Language(getattr(importlib.import_module(grammar.module), grammar.entry)())
    tags = "\n".join((files(module) / "queries" / "tags.scm").read_text() for module in grammar.tags_from)
    return language, Query(language, "\n".join([grammar.before, tags, grammar.after]))


class _SymbolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    symbol: str = Field(pattern=r"^[\w$]+$", max_length=256, description="A bare name, not 'a.b'.")
    path: str = Field(".", description="File or directory.")
    language: LanguageName | None = None


class FindDefinitionArgs(_SymbolArgs):
    pass


class FindReferencesArgs(_SymbolArgs):
    include_definition: bool = False
    max_results: int = Field(500, ge=1, le=5000)


@dataclass(frozen=True, order=True)
class _Hit:
    path: str
    line: int
    column: int
    kind: str
    text: str


@dataclass
class _Scan:
    hits: list[_Hit] = field(default_factory=list)
    parsed: int = 0
    skipped: list[str] = field(default_factory=list)
    truncated: bool = False


# What a scan collects from one parsed file: (name node, kind) pairs.
_Collect = Callable[[Tree, bytes, _Grammar], list[tuple[Node, str]]]


def _definition_sites(tree: Tree, grammar: _Grammar, symbol: bytes) -> dict[int, tuple[Node, str]]:
    """The name nodes defining `symbol`, by start byte, each with the kind its earliest pattern gives."""
    _, query = _compiled(grammar.name)
    best: dict[int, tuple[int, Node, str]] = {}
    for pattern, captures in QueryCursor(query).matches(tree.root_node):
        kind = next((c.removeprefix("definition.") for c in captures if c.startswith("definition.")), None)
        names = captures.get("name")
        if kind is None or not names or names[0].text != symbol:
            continue
        name = names[0]
        if name.start_byte not in best or pattern < best[name.start_byte][0]:
            best[name.start_byte] = (pattern, name, kind)
    return {start: (name, kind) for start, (_, name, kind) in best.items()}


def _identifiers(tree: Tree, source: bytes, symbol: bytes) -> list[Node]:
    """Every identifier node (of any identifier type) spelled exactly `symbol`; comments and strings excluded."""
    found = []
    for occurrence in re.finditer(re.escape(symbol), source):
        node = tree.root_node.named_descendant_for_byte_range(occurrence.start(), occurrence.end())
        if (
            node is not None
            and node.type.endswith("identifier")
            and (node.start_byte, node.end_byte) == occurrence.span()
        ):
            found.append(node)
    return found


def _collect_definitions(symbol: bytes) -> _Collect:
    def collect(tree: Tree, source: bytes, grammar: _Grammar) -> list[tuple[Node, str]]:
        return list(_definition_sites(tree, grammar, symbol).values())

    return collect


def _collect_references(symbol: bytes, include_definition: bool) -> _Collect:
    def collect(tree: Tree, source: bytes, grammar: _Grammar) -> list[tuple[Node, str]]:
        found = _identifiers(tree, source, symbol)
        if found and not include_definition:
            definitions = _definition_sites(tree, grammar, symbol)
            found = [node for node in found if node.start_byte not in definitions]
        return [(node, "") for node in found]

    return collect


def _hit(path: str, lines: list[bytes], node: Node, kind: str) -> _Hit:
    row, byte_column = node.start_point
    line = lines[row]
    column = len(line[:byte_column].decode("utf-8", errors="replace")) + 1
    text = line.decode("utf-8", errors="replace").strip()
    if len(text) > _MAX_LINE_CHARS:
        text = text[:_MAX_LINE_CHARS] + "…"
    return _Hit(path, row + 1, column, kind, text)


def _read_source(path: Path) -> bytes | None:
    try:
        if path.stat().st_size > _MAX_SOURCE_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


def _scan(
    root: Path, candidates: Sequence[tuple[str, _Grammar]], collect: _Collect, limit: int | None = None
) -> _Scan:
    """Parse each candidate file (in path order) and gather hits, stopping once there are more than
    `limit`; blocking, so run it in a worker thread."""
    parsers: dict[str, Parser] = {}
    scan = _Scan()
    for rel, grammar in candidates:
        source = _read_source(root / rel)
        if source is None:
            scan.skipped.append(rel)
            continue
        if grammar.name not in parsers:
            parsers[grammar.name] = Parser(_compiled(grammar.name)[0])
        tree = parsers[grammar.name].parse(source)
        scan.parsed += 1
        sites = collect(tree, source, grammar)
        if sites:
            lines = source.split(b"\n")
            scan.hits.extend(_hit(rel, lines, node, kind) for node, kind in sites)
        if limit is not None and len(scan.hits) > limit:
            scan.truncated = True
            break
    scan.hits.sort()
    if scan.truncated:
        del scan.hits[limit:]
    return scan


def _grammar_for_file(rel: str, language: LanguageName | None) -> _Grammar:
    """The grammar for one named file: by extension, or `language` for files without a known one."""
    by_extension = _BY_EXTENSION.get(Path(rel).suffix.lower())
    if by_extension is not None:
        if language not in (None, by_extension.language):
            raise ToolFailure(f"{rel!r} is a {by_extension.language} file, not {language}")
        return by_extension
    if language is not None:
        return next(g for g in _GRAMMARS.values() if g.language == language)
    raise ToolFailure(
        f"{rel!r} is not a source file of a supported language (extensions: {_SUPPORTED}); "
        "pass `language` to parse it anyway"
    )


async def _candidate_files(
    ctx: ToolContext, target: str, symbol: str, language: LanguageName | None
) -> list[tuple[str, _Grammar]]:
    """Files under the directory `target` that contain `symbol` as a whole word, with their grammar."""
    rg = find_binary("rg")
    if rg is None:
        raise ToolFailure("ripgrep (rg) is not installed on this server")
    extensions = [ext for ext, g in _BY_EXTENSION.items() if language in (None, g.language)]
    argv = [rg, "--no-config", "--files-with-matches", "--null", "--word-regexp", "--fixed-strings"]
    for ext in extensions:
        argv += ["--iglob", f"*{ext}"]
    argv += ["-e", symbol]
    if target != ".":  # without a path rg prints paths without "./"
        argv += ["--", target]
    result = await run_process(
        argv,
        cwd=ctx.workspace.resolve(),
        place=ctx.place,
        extra_env=ctx.env,
        timeout_s=_RG_TIMEOUT_S,
        max_output_bytes=_RG_MAX_OUTPUT_BYTES,
    )
    if result.timed_out:
        raise ToolFailure(f"looking for files mentioning {symbol!r} took over {_RG_TIMEOUT_S:.0f} s")
    if result.exit_code == 2 and not result.stdout:
        raise ToolFailure(f"ripgrep failed: {result.stderr.strip()}")
    return [
        (rel, _BY_EXTENSION[Path(rel).suffix.lower()])
        for rel in sorted(filter(None, result.stdout.split("\0")))
    ]


async def _search(
    args: _SymbolArgs, ctx: ToolContext, collect: _Collect, limit: int | None = None
) -> tuple[str, _Scan]:
    """Resolve the path, pick candidate files and scan them; returns the shown path and the scan."""
    resolved = resolve_in_workspace(ctx.workspace, args.path)
    if not resolved.exists():
        raise ToolFailure(f"path {args.path!r} does not exist")
    target = relative_to_workspace(ctx.workspace, resolved)
    if resolved.is_dir():
        candidates = await _candidate_files(ctx, target, args.symbol, args.language)
    else:
        candidates = [(target, _grammar_for_file(target, args.language))]
    scan = await asyncio.to_thread(_scan, ctx.workspace.resolve(), candidates, collect, limit)
    return target, scan


def _metadata(scan: _Scan) -> dict[str, object]:
    metadata: dict[str, object] = {
        "matches": len(scan.hits),
        "files": len({hit.path for hit in scan.hits}),
        "parsed_files": scan.parsed,
        "truncated": scan.truncated,
    }
    if scan.skipped:
        metadata["skipped_files"] = scan.skipped
    return metadata


def _nothing_found(what: str, args: _SymbolArgs, target: str, scan: _Scan) -> str:
    where = "the workspace" if target == "." else repr(target)
    if scan.parsed:
        searched = f"{scan.parsed} candidate file(s) parsed"
    else:
        searched = f"no {args.language or 'supported source'} file mentions the word"
    return (
        f"No {what} of {args.symbol!r} found in {where} ({searched}). Check the spelling and case, "
        "search a wider path, or use grep: the symbol may live in an ignored or hidden file, in "
        "another language, or be created dynamically."
    )


@tool("find_definition", family="code", lane="query", truncation_hint=_TRUNCATION_HINT, rule_subject=PATH)
async def find_definition(args: FindDefinitionArgs, ctx: ToolContext) -> ToolOutput:
    """Find where a function, class, method, variable or type is defined: `path:line: kind: first
    line`. Asks the language server running for the code's language, else parses the code
    (tree-sitter): unlike grep it skips comments, strings and mere uses.
    """
    target, servers = _target_and_servers(args, ctx)
    answered = await for_model.definitions(servers, args.symbol, target)
    if answered is not None:
        output = "\n".join(f"{s.path}:{s.line}: {s.kind}: {s.text}" for s in answered.sites)
        return ToolOutput(output=output, metadata=_answered_metadata(answered))
    target, scan = await _search(args, ctx, _collect_definitions(args.symbol.encode()))
    if not scan.hits:
        return ToolOutput(output=_nothing_found("definition", args, target, scan), metadata=_metadata(scan))
    output = "\n".join(f"{h.path}:{h.line}: {h.kind}: {h.text}" for h in scan.hits)
    return ToolOutput(output=output, metadata=_metadata(scan))


@tool("find_references", family="code", lane="query", truncation_hint=_TRUNCATION_HINT, rule_subject=PATH)
async def find_references(args: FindReferencesArgs, ctx: ToolContext) -> ToolOutput:
    """Find every use of a name (calls, reads, imports, annotations): `path:line:column: text`.
    Asks the language server running for the code's language (uses of what the name is bound to
    where it is defined), else parses the code: comments, strings and longer names do not match,
    same-named symbols of other scopes do. Use it before renaming or changing a signature.
    """
    target, servers = _target_and_servers(args, ctx)
    answered = await for_model.references(
        servers, args.symbol, target, args.include_definition, args.max_results
    )
    if answered is not None:
        hits = [(s.path, s.line, s.column, s.text) for s in answered.sites]
        return _references_output(hits, answered.truncated, args, _answered_metadata(answered))
    collect = _collect_references(args.symbol.encode(), args.include_definition)
    target, scan = await _search(args, ctx, collect, args.max_results)
    if not scan.hits:
        return ToolOutput(output=_nothing_found("reference", args, target, scan), metadata=_metadata(scan))
    hits = [(h.path, h.line, h.column, h.text) for h in scan.hits]
    return _references_output(hits, scan.truncated, args, _metadata(scan))


def _target_and_servers(args: _SymbolArgs, ctx: ToolContext) -> tuple[str, list[LanguageServer]]:
    """The workspace-relative path searched, and the language servers running for it."""
    target = relative_to_workspace(ctx.workspace, resolve_in_workspace(ctx.workspace, args.path))
    return target, for_model.servers_for(ctx, target, args.language)


def _answered_metadata(answered: for_model.Found) -> dict[str, object]:
    return {
        "matches": len(answered.sites),
        "files": len({site.path for site in answered.sites}),
        "truncated": answered.truncated,
        "language_server": answered.server,
    }


def _references_output(
    hits: list[tuple[str, int, int, str]],
    truncated: bool,
    args: FindReferencesArgs,
    metadata: dict[str, object],
) -> ToolOutput:
    output = "\n".join(f"{path}:{line}:{column}: {text}" for path, line, column, text in hits)
    if truncated:
        output += (
            f"\n[stopped after {args.max_results} references; more exist. Narrow `path` or `language`, "
            "or raise max_results (up to 5000).]"
        )
    return ToolOutput(output=output, metadata=metadata)


TOOLS: list[Tool] = [find_definition, find_references]

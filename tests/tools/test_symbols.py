"""find_definition and find_references: real ripgrep and tree-sitter over small real source trees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry
from a3s_agent.tools.symbols import TOOLS

SOURCES = {
    "app.py": """\
import os

LIMIT = 10


class Config:
    name = "default"

    @property
    def load(self):
        return load(self.name)


def load(path):
    # load is documented here; "load" in a string is not a reference
    return os.path.join(path, "load")


print(load("a"), Config().load, loader)
""",
    "web/store.js": """\
// store helpers
function fetchAll(url) { return fetch(url); }
const cache = new Map();
class Store { size = 0; refresh() { return fetchAll(this.size); } }
fetchAll("/api");
""",
    "web/shapes.ts": """\
export interface Shape { area(): number }
type Id = string;
enum Color { Red }
export class Circle implements Shape {
  area(): number { return 3; }
}
export function makeCircle(): Circle { return new Circle(); }
""",
    "web/button.tsx": """\
export function Button(props: { label: string }) { return <button>{props.label}</button>; }
const App = () => <Button label="x" />;
""",
    "server/main.go": """\
package main

const Limit = 3

type Server struct { Port int }

func (s *Server) Serve() {}

func NewServer() *Server { return &Server{Port: Limit} }

func main() { NewServer().Serve() }
""",
    "core/lib.rs": """\
const MAX: u32 = 5;
pub struct Point { x: i32 }
trait Area { fn area(&self) -> f64; }
impl Point { fn origin() -> Point { Point { x: 0 } } }
fn main() { let p = Point::origin(); }
""",
    "java/Main.java": """\
public class Main {
    private int count = 0;
    public String describe() { return helper(); }
    private String helper() { return "x"; }
}
""",
    "native/util.c": """\
#define MAX_SIZE 10
typedef int myint;
int add(int a, int b) { return a + b; }
int main(void) { return add(1, MAX_SIZE); }
""",
    "native/shape.cpp": """\
namespace geo {
class Polygon {
 public:
  int sides();
};
}
int geo::Polygon::sides() { return 4; }
""",
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for rel, text in SOURCES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


async def run(workspace: Path, name: str, **arguments: object) -> ToolOutput:
    return await ToolRegistry(TOOLS).run(name, json.dumps(arguments), ToolContext(workspace=workspace))


def test_both_tools_are_query_tools_in_the_code_family() -> None:
    assert [(t.name, t.tags) for t in TOOLS] == [
        ("find_definition", ["code", "query"]),
        ("find_references", ["code", "query"]),
    ]


@pytest.mark.parametrize(
    ("symbol", "expected"),
    [
        ("LIMIT", "app.py:3: constant: LIMIT = 10"),
        ("Config", "app.py:6: class: class Config:"),
        ("name", 'app.py:7: field: name = "default"'),
        ("fetchAll", "web/store.js:2: function: function fetchAll(url) { return fetch(url); }"),
        ("cache", "web/store.js:3: variable: const cache = new Map();"),
        ("refresh", "web/store.js:4: method: class Store { size = 0; refresh() { return fetchAll(this.size); } }"),
        ("Shape", "web/shapes.ts:1: interface: export interface Shape { area(): number }"),
        ("Id", "web/shapes.ts:2: type: type Id = string;"),
        ("Color", "web/shapes.ts:3: enum: enum Color { Red }"),
        ("Circle", "web/shapes.ts:4: class: export class Circle implements Shape {"),
        ("Button", "web/button.tsx:1: function: export function Button(props: { label: string }) "
         "{ return <button>{props.label}</button>; }"),
        ("Limit", "server/main.go:3: constant: const Limit = 3"),
        ("Server", "server/main.go:5: type: type Server struct { Port int }"),
        ("Serve", "server/main.go:7: method: func (s *Server) Serve() {}"),
        ("MAX", "core/lib.rs:1: constant: const MAX: u32 = 5;"),
        ("Point", "core/lib.rs:2: class: pub struct Point { x: i32 }"),
        ("origin", "core/lib.rs:4: method: impl Point { fn origin() -> Point { Point { x: 0 } } }"),
        ("Main", "java/Main.java:1: class: public class Main {"),
        ("count", "java/Main.java:2: field: private int count = 0;"),
        ("helper", 'java/Main.java:4: method: private String helper() { return "x"; }'),
        ("MAX_SIZE", "native/util.c:1: macro: #define MAX_SIZE 10"),
        ("myint", "native/util.c:2: type: typedef int myint;"),
        ("add", "native/util.c:3: function: int add(int a, int b) { return a + b; }"),
        ("geo", "native/shape.cpp:1: module: namespace geo {"),
    ],
)  # fmt: skip
async def test_definitions_in_each_language_give_line_kind_and_text(
    workspace: Path, symbol: str, expected: str
) -> None:
    result = await run(workspace, "find_definition", symbol=symbol)
    assert result.success
    assert result.output == expected
    assert result.metadata["matches"] == 1


async def test_every_definition_of_a_name_is_listed_with_its_own_kind(workspace: Path) -> None:
    result = await run(workspace, "find_definition", symbol="load")
    assert result.output.splitlines() == [
        "app.py:10: method: def load(self):",
        "app.py:14: function: def load(path):",
    ]
    cpp = await run(workspace, "find_definition", symbol="sides")
    assert cpp.output.splitlines() == [
        "native/shape.cpp:4: method: int sides();",
        "native/shape.cpp:7: method: int geo::Polygon::sides() { return 4; }",
    ]


async def test_language_restricts_the_search(workspace: Path) -> None:
    everywhere = await run(workspace, "find_definition", symbol="area")
    assert everywhere.metadata["files"] == 2  # shapes.ts and lib.rs
    rust_only = await run(workspace, "find_definition", symbol="area", language="rust")
    assert rust_only.output == "core/lib.rs:3: method: trait Area { fn area(&self) -> f64; }"


async def test_no_definition_is_a_success_with_a_hint(workspace: Path) -> None:
    result = await run(workspace, "find_definition", symbol="loader")
    assert result.success
    assert result.metadata["matches"] == 0
    assert "No definition of 'loader'" in result.output and "grep" in result.output


async def test_references_exclude_definitions_comments_strings_and_longer_names(workspace: Path) -> None:
    result = await run(workspace, "find_references", symbol="load")
    assert result.output.splitlines() == [
        "app.py:11:16: return load(self.name)",
        'app.py:19:7: print(load("a"), Config().load, loader)',
        'app.py:19:27: print(load("a"), Config().load, loader)',
    ]
    assert (result.metadata["matches"], result.metadata["files"]) == (3, 1)


async def test_references_can_include_the_definitions(workspace: Path) -> None:
    result = await run(workspace, "find_references", symbol="load", include_definition=True)
    assert [line.split(": ")[0] for line in result.output.splitlines()] == [
        "app.py:10:9",
        "app.py:11:16",
        "app.py:14:5",
        "app.py:19:7",
        "app.py:19:27",
    ]


@pytest.mark.parametrize(
    ("symbol", "expected"),
    [
        ("fetchAll", ["web/store.js:4:44", "web/store.js:5:1"]),
        ("Circle", ["web/shapes.ts:7:31", "web/shapes.ts:7:51"]),
        ("Button", ["web/button.tsx:2:20"]),
        ("Server", ["server/main.go:7:10", "server/main.go:9:19", "server/main.go:9:36"]),
        ("Point", ["core/lib.rs:4:6", "core/lib.rs:4:29", "core/lib.rs:4:37", "core/lib.rs:5:21"]),
        ("helper", ["java/Main.java:3:39"]),
        ("add", ["native/util.c:4:25"]),
    ],
)
async def test_references_in_each_language(workspace: Path, symbol: str, expected: list[str]) -> None:
    result = await run(workspace, "find_references", symbol=symbol)
    assert [line.split(": ")[0] for line in result.output.splitlines()] == expected


async def test_columns_count_characters_not_bytes(tmp_path: Path) -> None:
    (tmp_path / "u.py").write_text("é = 'ü'; x = run()\n")
    result = await run(tmp_path, "find_references", symbol="run")
    assert result.output == "u.py:1:14: é = 'ü'; x = run()"


async def test_max_results_cuts_references_and_says_so(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text("tick()\n" * 10)
    result = await run(tmp_path, "find_references", symbol="tick", max_results=15)
    lines = result.output.splitlines()
    assert lines[:15] == [f"m{i}.py:{n}:1: tick()" for i in range(2) for n in range(1, 11)][:15]
    assert "stopped after 15 references" in lines[15]
    assert result.metadata["truncated"] is True


async def test_a_file_path_is_parsed_by_its_extension_or_language(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("#!/usr/bin/env python\ndef main():\n    pass\n")
    unknown = await run(tmp_path, "find_definition", symbol="main", path="tool")
    assert not unknown.success and "pass `language`" in unknown.error
    forced = await run(tmp_path, "find_definition", symbol="main", path="tool", language="python")
    assert forced.output == "tool:2: function: def main():"


async def test_a_file_of_another_language_than_asked_is_refused(workspace: Path) -> None:
    result = await run(workspace, "find_definition", symbol="add", path="native/util.c", language="go")
    assert not result.success
    assert "is a c file, not go" in result.error


@pytest.mark.parametrize("name", ["find_definition", "find_references"])
@pytest.mark.parametrize("path", ["..", "/etc", "app.py/../../x"])
async def test_paths_outside_the_workspace_are_refused(workspace: Path, name: str, path: str) -> None:
    result = await run(workspace, name, symbol="load", path=path)
    assert not result.success
    assert "outside the workspace" in result.error


async def test_a_missing_path_is_a_failure(workspace: Path) -> None:
    result = await run(workspace, "find_references", symbol="load", path="nope")
    assert not result.success and "does not exist" in result.error


@pytest.mark.parametrize(
    "arguments", [{"symbol": "a.b"}, {"symbol": ""}, {"symbol": "x", "language": "cobol"}]
)
async def test_malformed_arguments_are_rejected(workspace: Path, arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await run(workspace, "find_definition", **arguments)


async def test_the_one_definition_is_found_among_thousands_of_files(tmp_path: Path) -> None:
    for d in range(40):
        package = tmp_path / f"pkg{d}"
        package.mkdir()
        for f in range(75):
            (package / f"mod{f}.py").write_text(f"def f_{d}_{f}():\n    return {f}\n")
    (tmp_path / "pkg17" / "mod33.py").write_text("import os\n\n\ndef needle_function(a):\n    return a\n")
    (tmp_path / "pkg2" / "mod5.py").write_text("# needle_function is called below\nneedle_function(1)\n")
    result = await run(tmp_path, "find_definition", symbol="needle_function")
    assert result.output == "pkg17/mod33.py:4: function: def needle_function(a):"
    assert result.metadata["parsed_files"] == 2  # only the files that mention the word

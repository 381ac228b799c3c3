"""The CodingAgent text protocol: parsing replies, rendering commands, line edits and the outbox."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from a3s_agent.text_protocol.commands import (
    RUN_COMMAND_TIMEOUT_SECONDS,
    Command,
    CreateFile,
    DeleteFile,
    Done,
    EditFile,
    Message,
    ParseError,
    ReadFile,
    RunCommand,
    check_path,
)
from a3s_agent.text_protocol.parser import parse_response
from a3s_agent.text_protocol.renderer import (
    CONTINUATION_PROMPT,
    MAX_OUTPUT_CHARS,
    PROTOCOL_INSTRUCTIONS,
    CommandResult,
    render,
    render_outbox,
    truncate_output,
)
from a3s_agent.tools.line_edits import apply_line_edit


def only(text: str) -> Command | ParseError:
    items = parse_response(text)
    assert len(items) == 1, items
    return items[0]


def error_of(text: str) -> ParseError:
    item = only(text)
    assert isinstance(item, ParseError), item
    return item


# Each command


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[CREATE_FILE path="src/a.py"]\nx = 1\n[/CREATE_FILE]', CreateFile("src/a.py", "x = 1\n")),
        (
            '[EDIT_FILE path="a.txt" start_line="2" end_line="4"]\nnew\n[/EDIT_FILE]',
            EditFile("a.txt", 2, 4, "new\n"),
        ),
        ('[DELETE_FILE path="old.txt"]', DeleteFile("old.txt")),
        ('[READ_FILE path="src/a.py"]', ReadFile("src/a.py")),
        ("[RUN_COMMAND]\ndotnet build\n[/RUN_COMMAND]", RunCommand("dotnet build")),
        ("[MESSAGE]\nHello there\n[/MESSAGE]", Message("Hello there")),
        ("[DONE]\nBuilt the calculator\n[/DONE]", Done("Built the calculator")),
    ],
)
def test_each_command_in_the_spec_syntax(text: str, expected: Command) -> None:
    assert only(text) == expected


# Parsing rules


def test_rule1_opening_tag_is_found_at_the_start_of_a_trimmed_line() -> None:
    assert only('   \t[READ_FILE path="a.py"]   ') == ReadFile("a.py")


def test_rule1_a_tag_inside_a_line_of_prose_is_not_a_command() -> None:
    assert parse_response('Next I will send [READ_FILE path="a.py"] to look.') == []


def test_rule1_tag_names_are_upper_case_and_whole() -> None:
    assert parse_response('[read_file path="a.py"]\n[READ_FILES_NOW]x\n[DONEX]') == []


def test_rule2_attributes_are_key_value_pairs_in_any_order() -> None:
    text = '[EDIT_FILE end_line = "3" path="a b/c.txt"  start_line="1"]\nx\n[/EDIT_FILE]'
    assert only(text) == EditFile("a b/c.txt", 1, 3, "x\n")


def test_rule2_unknown_attributes_are_ignored() -> None:
    assert only('[DELETE_FILE force="yes" path="a.py"]') == DeleteFile("a.py")


def test_rule2_a_bracket_inside_a_quoted_value_belongs_to_the_value() -> None:
    assert only('[READ_FILE path="data/[1].txt"]') == ReadFile("data/[1].txt")


def test_rule3_body_is_verbatim_with_indentation_and_blank_lines() -> None:
    body = "def f():\n\n    return 1  \n\t# tab\n"
    assert only(f'[CREATE_FILE path="f.py"]\n{body}[/CREATE_FILE]') == CreateFile("f.py", body)


def test_rule3_empty_body_is_empty_and_one_blank_line_is_a_newline() -> None:
    assert only('[CREATE_FILE path="e"]\n[/CREATE_FILE]') == CreateFile("e", "")
    assert only('[CREATE_FILE path="e"]\n\n[/CREATE_FILE]') == CreateFile("e", "\n")


def test_rule3_body_lines_that_look_like_tags_are_kept() -> None:
    body = (
        "[/RUN_COMMAND]\n[DONE]\n[/CREATE_FILE] trailing\nx [/CREATE_FILE]\n[/CREATE_FILE ]\n[/create_file]\n"
    )
    assert only(f'[CREATE_FILE path="doc.md"]\n{body}[/CREATE_FILE]') == CreateFile("doc.md", body)


def test_rule3_text_bodies_are_stripped() -> None:
    text = "[RUN_COMMAND]\n\n  make test  \n\n[/RUN_COMMAND]\n[MESSAGE]\n  hi\n  there \n[/MESSAGE]"
    assert parse_response(text) == [RunCommand("make test"), Message("hi\n  there")]


def test_rule3_multi_line_command_keeps_its_inner_lines() -> None:
    text = "[RUN_COMMAND]\ncat > f <<'EOF'\n  indented\nEOF\n[/RUN_COMMAND]"
    assert only(text) == RunCommand("cat > f <<'EOF'\n  indented\nEOF")


def test_rule4_closing_tag_is_matched_on_the_trimmed_line() -> None:
    assert only('[CREATE_FILE path="a"]\nx\n   [/CREATE_FILE]  \t') == CreateFile("a", "x\n")


def test_rule4_the_first_exact_closing_line_ends_the_block() -> None:
    text = '[CREATE_FILE path="a"]\none\n[/CREATE_FILE]\ntwo\n[/CREATE_FILE]'
    assert parse_response(text) == [CreateFile("a", "one\n")]


def test_rule5_and_6_several_commands_in_order_of_appearance() -> None:
    text = (
        '[CREATE_FILE path="a.py"]\nprint(1)\n[/CREATE_FILE]\n'
        "[RUN_COMMAND]\npython a.py\n[/RUN_COMMAND]\n"
        '[READ_FILE path="a.py"]\n'
        '[DELETE_FILE path="a.py"]\n'
        "[DONE]\nok\n[/DONE]"
    )
    assert parse_response(text) == [
        CreateFile("a.py", "print(1)\n"),
        RunCommand("python a.py"),
        ReadFile("a.py"),
        DeleteFile("a.py"),
        Done("ok"),
    ]


def test_rule7_text_between_blocks_is_ignored() -> None:
    text = (
        "Sure! First I'll create the file.\n\n```\n"
        '[CREATE_FILE path="a.py"]\nx\n[/CREATE_FILE]\n```\n'
        "Then [1, 2] and [NOTE] and [OK] CREATE_FILE: stuff are just prose.\n"
        "[/RUN_COMMAND]\n"
        "[MESSAGE]\nhi\n[/MESSAGE]\nThanks!"
    )
    assert parse_response(text) == [CreateFile("a.py", "x\n"), Message("hi")]


def test_empty_and_command_free_replies_give_nothing() -> None:
    assert parse_response("") == []
    assert parse_response("I am not sure what to do.\n") == []


def test_crlf_input_is_read_as_lf() -> None:
    text = (
        '[CREATE_FILE path="a.txt"]\r\nline 1\r\n  line 2\r\n[/CREATE_FILE]\r\n[DONE]\r\nfin\r\n[/DONE]\r\n'
    )
    assert parse_response(text) == [CreateFile("a.txt", "line 1\n  line 2\n"), Done("fin")]


def test_commands_after_done_are_still_returned() -> None:
    assert parse_response("[DONE]\na\n[/DONE]\n[MESSAGE]\nb\n[/MESSAGE]") == [Done("a"), Message("b")]


# Malformed blocks


def test_unclosed_block_is_an_error_naming_the_command_and_line() -> None:
    error = error_of('intro\n[CREATE_FILE path="a.py"]\nx = 1\n')
    assert error.line == 2
    assert "CREATE_FILE" in error.message and "[/CREATE_FILE]" in error.message


def test_after_an_unclosed_block_parsing_resumes_on_the_next_line() -> None:
    text = '[CREATE_FILE path="a.py"]\nx = 1\n[RUN_COMMAND]\nls\n[/RUN_COMMAND]'
    items = parse_response(text)
    assert isinstance(items[0], ParseError) and items[0].line == 1
    assert items[1:] == [RunCommand("ls")]


@pytest.mark.parametrize("tag", ["RUN_COMMAND", "MESSAGE", "DONE", "EDIT_FILE"])
def test_each_body_command_reports_a_missing_closing_tag(tag: str) -> None:
    attributes = ' path="a" start_line="1" end_line="1"' if tag == "EDIT_FILE" else ""
    error = error_of(f"[{tag}{attributes}]\nbody")
    assert f"[/{tag}]" in error.message


@pytest.mark.parametrize(
    "text",
    [
        "[CREATE_FILE]\nx\n[/CREATE_FILE]",
        "[CREATE_FILE src/a.py]\nx\n[/CREATE_FILE]",
        "[DELETE_FILE]",
        "[READ_FILE file='a.py']",
        '[EDIT_FILE start_line="1" end_line="2"]\nx\n[/EDIT_FILE]',
    ],
)
def test_missing_path_is_an_error_showing_the_syntax(text: str) -> None:
    error = error_of(text)
    assert "missing the path attribute" in error.message
    assert 'path="relative/path"' in error.message


def test_missing_line_attributes_are_named() -> None:
    error = error_of('[EDIT_FILE path="a"]\nx\n[/EDIT_FILE]')
    assert "start_line and end_line attributes" in error.message


@pytest.mark.parametrize("value", ["x", "1.5", "-1", "", "2a", "0x3"])
def test_non_integer_line_numbers_are_errors(value: str) -> None:
    error = error_of(f'[EDIT_FILE path="a" start_line="{value}" end_line="3"]\nx\n[/EDIT_FILE]')
    assert "start_line must be a whole number" in error.message


def test_line_zero_is_an_error() -> None:
    error = error_of('[EDIT_FILE path="a" start_line="0" end_line="3"]\nx\n[/EDIT_FILE]')
    assert "numbered from 1" in error.message


def test_start_after_end_is_an_error() -> None:
    error = error_of('[EDIT_FILE path="a" start_line="5" end_line="3"]\nx\n[/EDIT_FILE]')
    assert error.message == "EDIT_FILE start_line (5) is after end_line (3)"


def test_line_numbers_with_spaces_inside_the_quotes_are_read() -> None:
    assert only('[EDIT_FILE path="a" start_line=" 2 " end_line="2"]\n[/EDIT_FILE]') == EditFile("a", 2, 2, "")


@pytest.mark.parametrize("tag", ["CREATE_FILE", "DELETE_FILE", "READ_FILE"])
def test_empty_path_is_an_error(tag: str) -> None:
    closing = f"\nx\n[/{tag}]" if tag == "CREATE_FILE" else ""
    assert "empty path" in error_of(f'[{tag} path="  "]{closing}').message


def test_empty_run_command_is_an_error() -> None:
    assert "no command" in error_of("[RUN_COMMAND]\n   \n[/RUN_COMMAND]").message


def test_a_block_with_bad_attributes_is_skipped_whole() -> None:
    text = '[CREATE_FILE]\n[DELETE_FILE path="precious"]\n[/CREATE_FILE]\n[MESSAGE]\nafter\n[/MESSAGE]'
    items = parse_response(text)
    assert isinstance(items[0], ParseError)
    assert items[1:] == [Message("after")]


@pytest.mark.parametrize(
    "line",
    ["[DONE]All done[/DONE]", "[RUN_COMMAND] ls", '[READ_FILE path="a.py"', '[DELETE_FILE path="a"] now'],
)
def test_an_opening_tag_that_does_not_stand_alone_is_an_error(line: str) -> None:
    error = error_of(line)
    assert "stand alone on its line" in error.message


def test_parsing_continues_after_a_malformed_opening_tag() -> None:
    items = parse_response('[DONE]summary[/DONE]\n[READ_FILE path="a"]')
    assert isinstance(items[0], ParseError)
    assert items[1:] == [ReadFile("a")]


def test_unknown_command_is_an_error_and_its_block_is_skipped() -> None:
    text = '[WRITE_FILE path="a.py"]\n[DELETE_FILE path="b"]\n[/WRITE_FILE]\n[LIST_FILES]\n[DONE]\nx\n[/DONE]'
    first, second, done = parse_response(text)
    assert isinstance(first, ParseError) and first.line == 1
    assert "unknown command WRITE_FILE" in first.message and "CREATE_FILE" in first.message
    assert isinstance(second, ParseError) and second.line == 4
    assert done == Done("x")


def test_errors_carry_the_line_of_their_opening_tag() -> None:
    text = 'a\nb\n[DELETE_FILE]\nc\n[EDIT_FILE path="x" start_line="q" end_line="1"]\n[/EDIT_FILE]'
    assert [item.line for item in parse_response(text) if isinstance(item, ParseError)] == [3, 5]


@given(st.text())
def test_any_text_parses_without_raising(text: str) -> None:
    for item in parse_response(text):
        assert isinstance(
            item, CreateFile | EditFile | DeleteFile | ReadFile | RunCommand | Message | Done | ParseError
        )


@given(
    st.lists(
        st.sampled_from(["[CREATE_FILE", "[EDIT_FILE", "[/CREATE_FILE]", '"', "]", " ", "\n", "x=", "1"])
    )
)
def test_tag_fragments_parse_without_raising(parts: list[str]) -> None:
    parse_response("".join(parts))


# Rendering


@pytest.mark.parametrize(
    ("command", "text"),
    [
        (CreateFile("src/a.py", "x = 1\n"), '[CREATE_FILE path="src/a.py"]\nx = 1\n[/CREATE_FILE]'),
        (CreateFile("e", ""), '[CREATE_FILE path="e"]\n[/CREATE_FILE]'),
        (EditFile("a", 1, 3, "y\n"), '[EDIT_FILE path="a" start_line="1" end_line="3"]\ny\n[/EDIT_FILE]'),
        (DeleteFile("a b"), '[DELETE_FILE path="a b"]'),
        (ReadFile("a"), '[READ_FILE path="a"]'),
        (RunCommand("make"), "[RUN_COMMAND]\nmake\n[/RUN_COMMAND]"),
        (Message("hi\nthere"), "[MESSAGE]\nhi\nthere\n[/MESSAGE]"),
        (Done(""), "[DONE]\n[/DONE]"),
    ],
)
def test_render_writes_the_canonical_text(command: Command, text: str) -> None:
    assert render(command) == text
    assert only(text) == command


def test_render_adds_the_final_newline_a_body_lacks() -> None:
    assert render(CreateFile("a", "x")) == '[CREATE_FILE path="a"]\nx\n[/CREATE_FILE]'


@pytest.mark.parametrize(
    "command",
    [
        CreateFile("", "x"),
        CreateFile('a"b', "x"),
        ReadFile("a\nb"),
        CreateFile("a", "x\n  [/CREATE_FILE] \ny\n"),
        EditFile("a", 0, 1, ""),
        EditFile("a", 3, 2, ""),
        RunCommand("  "),
        Done("[/DONE]"),
    ],
)
def test_render_refuses_what_the_syntax_cannot_express(command: Command) -> None:
    with pytest.raises(ValueError):
        render(command)


_PATH_PART = st.text(st.characters(blacklist_characters='"\r\n/\\', blacklist_categories=["Cs"]), min_size=1)
_PATHS = st.lists(_PATH_PART, min_size=1, max_size=3).map("/".join).filter(lambda path: path.strip() != "")


def _line(closing: str) -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"])).filter(
        lambda line: line.strip() != closing
    )


def _content(closing: str) -> st.SearchStrategy[str]:
    return st.lists(_line(closing)).map(lambda lines: "".join(f"{line}\n" for line in lines))


def _text(closing: str) -> st.SearchStrategy[str]:
    return st.lists(_line(closing), min_size=1).map(lambda lines: "\n".join(lines).strip())


def _edits() -> st.SearchStrategy[EditFile]:
    return st.tuples(_PATHS, st.integers(1, 10_000), st.integers(0, 100), _content("[/EDIT_FILE]")).map(
        lambda args: EditFile(args[0], args[1], args[1] + args[2], args[3])
    )


COMMANDS: st.SearchStrategy[Command] = st.one_of(
    st.builds(CreateFile, _PATHS, _content("[/CREATE_FILE]")),
    _edits(),
    st.builds(DeleteFile, _PATHS),
    st.builds(ReadFile, _PATHS),
    st.builds(RunCommand, _text("[/RUN_COMMAND]").filter(bool)),
    st.builds(Message, _text("[/MESSAGE]")),
    st.builds(Done, _text("[/DONE]")),
)
PROSE = st.text(st.characters(blacklist_characters="\r\n[", blacklist_categories=["Cs"]))


@given(COMMANDS)
def test_render_then_parse_round_trips(command: Command) -> None:
    assert parse_response(render(command)) == [command]


@given(st.lists(st.tuples(PROSE, COMMANDS)), PROSE)
def test_rendered_commands_round_trip_between_prose(pairs: list[tuple[str, Command]], tail: str) -> None:
    text = "\n".join(f"{prose}\n{render(command)}" for prose, command in pairs) + f"\n{tail}"
    assert parse_response(text) == [command for _, command in pairs]
    assert parse_response(text.replace("\n", "\r\n")) == [command for _, command in pairs]


# Paths


@pytest.mark.parametrize("path", ["a.py", "src/a.py", "a b/c.txt", ".hidden", "a/.../b", "a..b/c"])
def test_relative_paths_are_accepted(path: str) -> None:
    assert check_path(path) is None


@pytest.mark.parametrize(
    "path",
    ["../../../etc/passwd", "a/../../b", "a/..", "..", "/etc/passwd", "\\x", "C:/x", "c:x", "a\\..\\b"],
)
def test_paths_leaving_the_workspace_are_rejected(path: str) -> None:
    problem = check_path(path)
    assert problem is not None and problem.startswith("REJECTED: Path is outside workspace")


@pytest.mark.parametrize("path", ["", "  ", "a\x00b"])
def test_empty_and_nul_paths_are_rejected(path: str) -> None:
    problem = check_path(path)
    assert problem is not None and problem.startswith("REJECTED:")


# Line edits

FILE = "one\ntwo\nthree\n"


@pytest.mark.parametrize(
    ("start", "end", "replacement", "expected"),
    [
        (2, 2, "TWO\n", "one\nTWO\nthree\n"),
        (1, 1, "ONE\n", "ONE\ntwo\nthree\n"),
        (3, 3, "THREE\n", "one\ntwo\nTHREE\n"),
        (1, 3, "all\n", "all\n"),
        (2, 2, "a\nb\nc\n", "one\na\nb\nc\nthree\n"),
        (1, 2, "x\n", "x\nthree\n"),
        (2, 3, "", "one\n"),
        (1, 3, "", ""),
        (2, 2, "no newline", "one\nno newline\nthree\n"),
        (2, 2, "\n", "one\n\nthree\n"),
    ],
)
def test_line_edit_replaces_the_inclusive_range(
    start: int, end: int, replacement: str, expected: str
) -> None:
    assert apply_line_edit(FILE, start, end, replacement) == expected


def test_line_edit_of_a_file_without_a_final_newline() -> None:
    assert apply_line_edit("a\nb", 2, 2, "B\n") == "a\nB\n"
    assert apply_line_edit("a\nb", 1, 1, "A\n") == "A\nb"


def test_line_edit_keeps_crlf_line_endings() -> None:
    assert apply_line_edit("a\r\nb\r\nc\r\n", 2, 2, "x\ny\n") == "a\r\nx\r\ny\r\nc\r\n"


def test_line_edit_counts_lines_on_newlines_only() -> None:
    assert apply_line_edit("a\x0cb\u2028c\nd\n", 2, 2, "D\n") == "a\x0cb\u2028c\nD\n"


@pytest.mark.parametrize(
    ("original", "start", "end", "message"),
    [
        (FILE, 3, 4, "line range 3-4 is outside the file, which has 3 lines"),
        (FILE, 4, 4, "outside the file"),
        ("only\n", 1, 2, "which has 1 line"),
        ("", 1, 1, "which has 0 lines"),
        (FILE, 0, 1, "start_line must be 1 or more"),
        (FILE, 3, 2, "start_line (3) is after end_line (2)"),
    ],
)
def test_line_edit_out_of_range_raises(original: str, start: int, end: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        apply_line_edit(original, start, end, "x\n")


@given(
    st.lists(st.text(st.characters(blacklist_characters="\r\n")), min_size=1),
    st.lists(st.text(st.characters(blacklist_characters="\r\n"))),
    st.data(),
)
def test_line_edit_splices_lines(lines: list[str], new: list[str], data: st.DataObject) -> None:
    start = data.draw(st.integers(1, len(lines)))
    end = data.draw(st.integers(start, len(lines)))
    original = "".join(f"{line}\n" for line in lines)
    result = apply_line_edit(original, start, end, "".join(f"{line}\n" for line in new))
    assert result.split("\n")[:-1] == lines[: start - 1] + new + lines[end:]


# Command results


def test_result_lines_match_the_spec() -> None:
    assert CommandResult("CREATE_FILE", True, "Created 'src/Calculator.cs'").format() == (
        "[OK] CREATE_FILE: Created 'src/Calculator.cs'"
    )
    assert CommandResult("EDIT_FILE", False, "File 'src/Missing.cs' not found").format() == (
        "[FAILED] EDIT_FILE: File 'src/Missing.cs' not found"
    )


def test_result_output_is_an_indented_line_when_present() -> None:
    result = CommandResult("RUN_COMMAND", True, "Ran 'dotnet build' (exit code 0)", "Build succeeded.\n")
    assert result.format() == "[OK] RUN_COMMAND: Ran 'dotnet build' (exit code 0)\n  Output: Build succeeded."
    assert CommandResult("RUN_COMMAND", True, "Ran 'true' (exit code 0)", " \n").format().count("\n") == 0


def test_multi_line_output_and_messages_stay_indented() -> None:
    result = CommandResult("RUN_COMMAND", False, "Ran 'make' (exit code 2)\nsee below", "a\nb")
    assert (
        result.format() == "[FAILED] RUN_COMMAND: Ran 'make' (exit code 2)\n  see below\n  Output: a\n    b"
    )


def test_output_is_truncated_at_the_limit() -> None:
    assert RUN_COMMAND_TIMEOUT_SECONDS == 30 and MAX_OUTPUT_CHARS == 4000
    long = "x" * (MAX_OUTPUT_CHARS + 10)
    cut = truncate_output(long)
    assert cut.startswith("x" * MAX_OUTPUT_CHARS + "\n[output truncated")
    assert f"{MAX_OUTPUT_CHARS} of {MAX_OUTPUT_CHARS + 10}" in cut
    assert truncate_output("x" * MAX_OUTPUT_CHARS) == "x" * MAX_OUTPUT_CHARS
    assert "[output truncated" in CommandResult("RUN_COMMAND", True, "Ran 'x'", long).format()


def test_parse_errors_become_failed_results() -> None:
    result = CommandResult.from_parse_error(ParseError("DELETE_FILE is missing the path attribute", 4))
    assert result.format() == "[FAILED] PARSE_ERROR: line 4: DELETE_FILE is missing the path attribute"


# The outbox

SPEC_HEADER = """\
=== HEADER ===
Session: a1b2c3d4
Sequence: 1
Task: Create a calculator app in C#
"""

SPEC_FILES = """\
## Workspace Files
  src/Calculator.cs (245 bytes)
  src/Program.cs (180 bytes)
  tests/CalculatorTests.cs (512 bytes)
"""

SPEC_RESULTS = """\
## Previous Command Results
[OK] CREATE_FILE: Created 'src/Calculator.cs'
[OK] RUN_COMMAND: Ran 'dotnet build' (exit code 0)
  Output: Build succeeded. 0 Warning(s) 0 Error(s)
[FAILED] EDIT_FILE: File 'src/Missing.cs' not found
"""

SPEC_REQUESTED = """\
## Requested File Contents
--- src/Calculator.cs ---
using System;

public class Calculator
{
    public int Add(int a, int b) => a + b;
}
--- end src/Calculator.cs ---
"""

CALCULATOR = "using System;\n\npublic class Calculator\n{\n    public int Add(int a, int b) => a + b;\n}\n"
SPEC_FILE_LIST = [("src/Calculator.cs", 245), ("src/Program.cs", 180), ("tests/CalculatorTests.cs", 512)]
SPEC_RESULT_LIST = [
    CommandResult("CREATE_FILE", True, "Created 'src/Calculator.cs'"),
    CommandResult(
        "RUN_COMMAND", True, "Ran 'dotnet build' (exit code 0)", "Build succeeded. 0 Warning(s) 0 Error(s)"
    ),
    CommandResult("EDIT_FILE", False, "File 'src/Missing.cs' not found"),
]
TASK = "Create a calculator app in C#"


def test_first_outbox_matches_the_spec_examples() -> None:
    outbox = render_outbox("a1b2c3d4", 1, TASK, SPEC_FILE_LIST, [], [], continuation=False)
    assert outbox.startswith(SPEC_HEADER)
    assert f"\n{SPEC_FILES}\n" in outbox
    context = outbox.split("=== CONTEXT ===")[1]
    assert "## Previous Command Results" not in context and "## Requested File Contents" not in context
    assert outbox.endswith(f"\n=== PROMPT ===\n{TASK}\n")


def test_continuation_outbox_matches_the_spec_examples() -> None:
    outbox = render_outbox(
        "a1b2c3d4", 2, TASK, SPEC_FILE_LIST, SPEC_RESULT_LIST, [("src/Calculator.cs", CALCULATOR)], True
    )
    assert f"\n{SPEC_FILES}\n{SPEC_RESULTS}\n{SPEC_REQUESTED}\n=== PROMPT ===\n" in outbox
    assert outbox.endswith(
        "=== PROMPT ===\nContinue working on the task based on the results above. "
        "If the task is complete, send [DONE] with a summary.\n"
    )
    assert CONTINUATION_PROMPT in outbox


def test_whole_outbox_layout() -> None:
    outbox = render_outbox("0123abcd", 1, "Say hi", [], [], [], continuation=False)
    assert outbox == (
        "=== HEADER ===\nSession: 0123abcd\nSequence: 1\nTask: Say hi\n\n"
        f"=== PROTOCOL ===\n{PROTOCOL_INSTRUCTIONS}\n\n"
        "=== CONTEXT ===\n## Workspace Files\n(empty workspace)\n\n"
        "=== PROMPT ===\nSay hi\n"
    )


def test_section_markers_appear_once_each_in_order() -> None:
    outbox = render_outbox("a1b2c3d4", 3, TASK, [], SPEC_RESULT_LIST, [("a", "x")], True)
    lines = outbox.split("\n")
    markers = [line for line in lines if line.startswith("=== ") and line.endswith(" ===")]
    assert markers == ["=== HEADER ===", "=== PROTOCOL ===", "=== CONTEXT ===", "=== PROMPT ==="]


def test_continuation_without_results_says_nothing_was_found() -> None:
    outbox = render_outbox("a1b2c3d4", 2, TASK, [], [], [], True)
    assert "## Previous Command Results\n(no commands were found in the previous response)\n" in outbox


def test_requested_files_without_final_newline_or_content() -> None:
    outbox = render_outbox("a1b2c3d4", 2, TASK, [], [], [("a.txt", "x"), ("e", "")], True)
    assert (
        "## Requested File Contents\n--- a.txt ---\nx\n--- end a.txt ---\n--- e ---\n--- end e ---\n"
        in outbox
    )


def test_multi_line_task_is_one_header_line_and_the_full_first_prompt() -> None:
    outbox = render_outbox("a1b2c3d4", 1, "Build it.\nThen test it.\n", [], [], [], False)
    assert "\nTask: Build it. Then test it.\n" in outbox
    assert outbox.endswith("=== PROMPT ===\nBuild it.\nThen test it.\n")


def test_protocol_section_is_the_same_in_every_outbox() -> None:
    first = render_outbox("a1b2c3d4", 1, TASK, [], [], [], False)
    later = render_outbox("a1b2c3d4", 7, TASK, SPEC_FILE_LIST, SPEC_RESULT_LIST, [("a", "b")], True)

    def protocol(outbox: str) -> str:
        return outbox.split("=== PROTOCOL ===\n")[1].split("\n\n=== CONTEXT ===")[0]

    assert protocol(first) == protocol(later) == PROTOCOL_INSTRUCTIONS


# The PROTOCOL section


def test_instructions_examples_are_valid_commands_of_every_kind() -> None:
    items = parse_response(PROTOCOL_INSTRUCTIONS)
    assert [type(item) for item in items] == [
        CreateFile,
        EditFile,
        DeleteFile,
        ReadFile,
        RunCommand,
        Message,
        Done,
    ]


def test_instructions_cover_paths_limits_and_guidelines() -> None:
    for needle in [
        "relative to the workspace root",
        "Absolute paths and paths containing .. are rejected",
        f"{RUN_COMMAND_TIMEOUT_SECONDS} seconds",
        f"{MAX_OUTPUT_CHARS} characters",
        "numbered from 1",
        "Requested File Contents",
        "PARSE_ERROR",
        "send DONE",
    ]:
        assert needle in PROTOCOL_INSTRUCTIONS, needle

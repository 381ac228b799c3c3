"""The permission rule engine: parsing, matching, evaluation order and persistence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.core.policy import permissions
from a3s_agent.core.policy.matching import workspace_path
from a3s_agent.core.policy.permissions import Evaluation, PermissionPolicy, add_rule
from a3s_agent.core.policy.rules import GIT_TOOLS, Rule, RuleType, canonical_tool_name, parse_rule
from a3s_agent.core.policy.shell_split import split_command
from a3s_agent.tools.builtin import builtin_registry
from a3s_agent.tools.registry import RuleSubject

WORKSPACE = "/home/dev/project"


SUBJECTS = {tool.name: tool.rule_subject for tool in builtin_registry().registered()}


def subject_of(tool: str) -> RuleSubject | None:
    """The rule subject the built-in tool a name means declares (None for any other tool)."""
    return SUBJECTS.get(canonical_tool_name(tool))


def evaluate(
    policy: PermissionPolicy, tool: str, arguments: dict[str, Any], workspace: str | None = None
) -> Evaluation:
    """The decision on a call, its arguments matched as the built-in tool of that name declares."""
    return permissions.evaluate(policy, tool, arguments, workspace, subject=subject_of(tool))


def matches(rule: str, tool: str, rule_type: RuleType = "allow", **arguments: Any) -> bool:
    return parse_rule(rule).matches(
        tool, arguments, rule_type=rule_type, subject=subject_of(tool), workspace=WORKSPACE
    )


def bash_allows(rule: str, command: str) -> bool:
    return matches(rule, "bash", "allow", command=command)


def bash_denies(rule: str, command: str) -> bool:
    return matches(rule, "bash", "deny", command=command)


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tool", "pattern"),
    [
        ("Bash", "Bash", None),
        ("Bash(cargo:*)", "Bash", "cargo:*"),
        ("Read(src/**/*.rs)", "Read", "src/**/*.rs"),
        ("WebFetch(domain:example.com)", "WebFetch", "domain:example.com"),
        ("*", "*", None),
        ("*(secret*)", "*", "secret*"),
        ("my-tool_2", "my-tool_2", None),
        ("  Edit  ", "Edit", None),
        ("Bash( npm test )", "Bash", "npm test"),
        ("Bash(python -c print(1))", "Bash", "python -c print(1)"),
    ],
)
def test_valid_rules_parse(text: str, tool: str, pattern: str | None) -> None:
    assert parse_rule(text) == Rule(tool=tool, pattern=pattern, raw=text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("(x)", "tool name before '(' is missing"),
        ("Bash(git:*", "not closed"),
        ("Bash)", "')' without '('"),
        ("Bash(x))", "unbalanced parentheses in the pattern"),
        ("Bash((x)", "unbalanced parentheses in the pattern"),
        ("Bash(x)(y)", "unbalanced parentheses in the pattern"),
        ("Bash()", "pattern is empty"),
        ("Bash(   )", "pattern is empty"),
        ("Bash(x)y", "unexpected text after the closing ')'"),
        ("Bash x", "must be '*' or letters"),
        ("Bash (x)", "must be '*' or letters"),
        ("Ba$h", "must be '*' or letters"),
        ("Read.file", "must be '*' or letters"),
        ("**", "must be '*' or letters"),
        ("Bash(a\nb)", "control character"),
        ("Bash(:*)", "prefix is needed before ':*'"),
        ("*( :*)", "prefix is needed before ':*'"),
        ("WebFetch(domain:)", "not a host name"),
        ("WebFetch(domain:*.example.com)", "not a host name"),
        ("*(domain:exa mple.com)", "not a host name"),
    ],
)
def test_malformed_rules_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match="permission rule") as caught:
        parse_rule(text)
    assert reason in str(caught.value)


def test_a_rule_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="must be a string"):
        parse_rule(["Bash"])  # type: ignore[arg-type]


def test_domain_and_prefix_forms_are_plain_text_for_other_tools() -> None:
    assert parse_rule("Read(domain:)").pattern == "domain:"
    assert parse_rule("Read(:*)").pattern == ":*"


# --- tool names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tool"),
    [
        ("Bash", "bash"),
        ("BASH", "bash"),
        ("Read", "read_file"),
        ("read_file", "read_file"),
        ("READ_FILE", "read_file"),
        ("Write", "write_file"),
        ("Edit", "edit_file"),
        ("MultiEdit", "edit_file"),
        ("Delete", "delete_file"),
        ("LS", "list_files"),
        ("List", "list_files"),
        ("Glob", "search_files"),
        ("Grep", "grep"),
        ("WebFetch", "web_fetch"),
        ("websearch", "web_search"),
        ("git_diff", "git_diff"),
        ("client_tool", "client_tool"),
    ],
)
def test_aliases_resolve_case_insensitively(name: str, tool: str) -> None:
    assert parse_rule(name).covers(tool)
    assert canonical_tool_name(name) == tool


def test_git_means_the_builtin_git_tools() -> None:
    rule = parse_rule("Git")
    assert rule.tools == frozenset(GIT_TOOLS)
    assert not rule.covers("git_push") and not rule.covers("bash")


def test_star_covers_every_tool_and_a_name_covers_only_its_tool() -> None:
    assert all(parse_rule("*").covers(tool) for tool in ("bash", "read_file", "anything_else"))
    assert not parse_rule("Read").covers("write_file")
    assert not parse_rule("client_tool").covers("client_tool_2")


def test_calls_may_name_the_tool_by_an_alias_too() -> None:
    assert matches("read_file(src/*)", "Read", path="src/a.py")


# --- bash -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("git", True),
        ("git status", True),
        ("  git   status  ", True),
        ("git\tstatus", True),
        ("gitk", False),
        ("git-lfs pull", False),
        ("legit status", False),
        ("echo git", False),
    ],
)
def test_bash_prefix_rules_respect_word_boundaries(command: str, allowed: bool) -> None:
    assert bash_allows("Bash(git:*)", command) is allowed


def test_bash_prefixes_may_have_several_words() -> None:
    assert bash_allows("Bash(cargo build:*)", "cargo build --release")
    assert bash_allows("Bash(cargo  build:*)", "cargo build")
    assert not bash_allows("Bash(cargo build:*)", "cargo builder")
    assert not bash_allows("Bash(cargo build:*)", "cargo test")


@pytest.mark.parametrize(
    "command",
    [
        "git status && rm -rf /",
        "git status; rm -rf /",
        "git status || rm -rf /",
        "git log | sh",
        "git log |& sh",
        "git status & rm -rf /",
        "git status\nrm -rf /",
        "git status; (rm -rf /)",
        "git status $(rm -rf /)",
        'git commit -m "$(rm -rf /)"',
        "git status `rm -rf /`",
        "git diff <(rm -rf /)",
        "git $(echo status)",
    ],
)
def test_allow_rules_do_not_cover_compound_commands_or_substitutions(command: str) -> None:
    assert not bash_allows("Bash(git:*)", command)
    assert not bash_allows("Bash(git *)", command)


@pytest.mark.parametrize(
    "command",
    [
        "git status && git diff",
        "git add . ; git commit -m wip",
        'git commit -m "fix: a && b; c | d"',
        "git commit -m 'uses $(x) and `y`'",
        "git log 2>&1",
        "git log &> log.txt",
        "git log >&2",
        "git status &",
        "(git status)",
    ],
)
def test_allow_rules_cover_compounds_whose_every_part_matches(command: str) -> None:
    assert bash_allows("Bash(git:*)", command)


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "ls && rm -rf /",
        "ls | rm -rf /",
        "echo $(rm -rf /)",
        'echo "$(rm -rf /)"',
        "echo `rm -rf /`",
        "FOO=1 rm -rf /",
        "if true; then rm -rf /; fi",
        "{ rm -rf /; }",
        "! rm -rf /",
    ],
)
def test_deny_rules_match_when_any_part_matches(command: str) -> None:
    assert bash_denies("Bash(rm:*)", command)
    assert matches("Bash(rm:*)", "bash", "ask", command=command)


@pytest.mark.parametrize("command", ['echo "rm -rf /"', "echo 'a; rm -rf /'", "grep rm file", "rmdir x"])
def test_deny_rules_do_not_match_quoted_text_or_other_commands(command: str) -> None:
    assert not bash_denies("Bash(rm:*)", command)


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(rm:*)", "sudo rm -rf /"),
        ("Bash(rm:*)", "env -i PATH=/bin rm -rf /"),
        ("Bash(rm:*)", "nohup nice -n 5 timeout 10 rm -rf /"),
        ("Bash(rm:*)", "find . -name '*.o' -exec rm {} +"),
        ("Bash(rm:*)", "ls | xargs -0 rm"),
        ("Bash(rm:*)", "sh -c 'cd / && rm -rf tmp'"),
        ("Bash(rm:*)", 'eval "rm -rf /"'),
        ("Bash(rm:*)", "/bin/rm -rf /"),
        ("Bash(rm:*)", "\\rm -rf /"),
        ("Bash(rm:*)", "'r''m' -rf /"),
        ("Bash(git push:*)", "env GIT_TRACE=1 git push --force"),
        ("Bash(git push:*)", "sudo -u deploy git push"),
        ("Bash(rm -rf *)", "sudo rm -rf /tmp/x"),
    ],
)
def test_deny_and_ask_rules_see_through_wrappers_paths_and_quotes(rule: str, command: str) -> None:
    assert bash_denies(rule, command)
    assert matches(rule, "bash", "ask", command=command)


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(rm -rf:*)", "rm -fr /"),
        ("Bash(rm -rf:*)", "rm -r -f /"),
        ("Bash(rm -rf:*)", "rm -R --force /"),
        ("Bash(rm -rf:*)", "rm --rec --force /"),  # GNU's abbreviations
        ("Bash(rm -rf:*)", "rm -v / -rf"),  # GNU programs take flags anywhere
        ("Bash(rm -rf /)", "rm -fr /"),
        ("Bash(git push:*)", "git -c core.sshCommand=x push"),
        ("Bash(git push:*)", "git --no-pager -C /repo push"),
        ("Bash(git push:*)", "git --git-dir=/x/.git push"),
        ("Bash(git push:*)", "git -c a=b -c c=d push origin"),
        ("Bash(git push:*)", "git -c $CONFIG push"),
        ("Bash(git push origin:*)", "git push --force origin main"),
        ("Bash(git push --force:*)", "git push -f"),
        ("Bash(cargo publish:*)", "cargo +nightly publish"),
        ("Bash(npm publish:*)", "sudo npm --registry https://r.example publish"),
        ("Bash(rm *)", 'sudo rm "a\nb"'),  # a glob's * spans a newline in an argument too
    ],
)
def test_deny_rules_see_the_rules_flags_and_words_past_options(rule: str, command: str) -> None:
    assert bash_denies(rule, command)
    assert matches(rule, "bash", "ask", command=command)


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(rm:*)", "nohup nice -n 5 timeout 10 rm -rf /"),  # plain wrappers run only rm
        ("Bash(rm:*)", 'eval "rm -rf /"'),
        ("Bash(rm:*)", "\\rm -rf /"),
        ("Bash(rm:*)", "'r''m' -rf /"),
        ("Bash(rm -rf:*)", "rm -R --force /"),
        ("Bash(rm -rf /)", "rm -fr /"),
        ("Bash(git push --force:*)", "git push -f"),
        ("Bash(git:*)", "! git diff --quiet"),  # keywords run nothing
        ("Bash(git:*)", "if git diff --quiet; then git status; fi"),
    ],
)
def test_allow_rules_prove_the_program_whatever_the_spelling(rule: str, command: str) -> None:
    assert bash_allows(rule, command)


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(rm:*)", "sudo rm -rf /"),  # sudo, doas and find -exec need a rule of their own
        ("Bash(rm:*)", "find . -name '*.o' -exec rm {} +"),
        ("Bash(rm:*)", "/bin/rm -rf /"),  # the program word as the rule writes it
        ("Bash(rm:*)", "sh -c 'cd / && rm -rf tmp'"),  # cd is a program of its own
        ("Bash(git push:*)", "git -c core.sshCommand=x push"),  # the rule's words first
        ("Bash(git:*)", "GIT_SSH_COMMAND=evil git fetch"),  # a variable changes what git runs
        ("Bash(git:*)", "env GIT_SSH_COMMAND=evil git fetch"),
        ("Bash(git:*)", "export GIT_PAGER=evil; git log"),
        ("Bash(git:*)", ""),
        ("Bash(git:*)", "[[ -d .git ]] && git status"),  # the parser cannot read it
    ],
)
def test_allow_rules_do_not_prove_what_the_rule_does_not_say(rule: str, command: str) -> None:
    assert not bash_allows(rule, command)


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(git push:*)", "git log --grep push"),  # the rule's words, not words anywhere
        ("Bash(git push:*)", "git commit -m 'push it'"),
        ("Bash(git push:*)", "git commit -m push"),
        ("Bash(rm -rf:*)", "rm -r build"),  # the rule's flags, all of them
        ("Bash(rm build:*)", "rm other build"),
        ("Bash(rm:*)", "sudo rmdir build"),
        ("Bash(rm:*)", "bash -c 'echo rm -rf /'"),
    ],
)
def test_what_a_command_runs_matches_only_as_the_rule_says(rule: str, command: str) -> None:
    assert not bash_denies(rule, command)


def test_a_command_the_parser_cannot_read_is_still_matched_as_text() -> None:
    assert bash_denies("Bash(rm:*)", "[[ -d build ]] && rm -rf build")
    assert bash_denies("Bash(rm:*)", "case $1 in x) rm -rf build;; esac")


def test_bash_globs_cover_the_whole_command() -> None:
    assert bash_allows("Bash(npm test)", "npm test")
    assert not bash_allows("Bash(npm test)", "npm test --watch")
    assert bash_allows("Bash(npm run *)", "npm run build:prod")
    assert bash_allows("Bash(*--help)", "cargo --help")
    assert not bash_allows("Bash(ls *)", "ls")
    assert not bash_allows("Bash(l?)", "ls")  # only * is a wildcard


def test_a_bare_bash_rule_covers_every_command() -> None:
    assert bash_allows("Bash", "echo $(date) && rm -rf /")
    assert bash_allows("*", "anything")


def test_the_command_splitter() -> None:
    assert split_command("a && b || c ; d | e & f\ng") == ["a", "b", "c", "d", "e", "f", "g"]
    assert split_command('echo "$(date)" done') == ['echo "', "date", '" done']
    assert split_command("echo `ls` x") == ["echo", "ls", "x"]
    assert split_command("a $( b ( c ) d ) e") == ["a", "b", "c", "d", "e"]
    assert split_command(r"echo \; x") == [r"echo \; x"]
    assert split_command(";;") == [";;"]
    assert split_command("echo 'unterminated ; x") == ["echo 'unterminated ; x"]
    assert split_command("a ) b") == ["a", "b"]


# --- paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("src/app.py", "src/app.py"),
        ("./src/app.py", "src/app.py"),
        ("././src//app.py", "src/app.py"),
        ("src/../lib/x.py", "lib/x.py"),
        ("src/", "src"),
        ("", "."),
        (".", "."),
        ("../outside", "../outside"),
        ("src/../../outside", "../outside"),
        (f"{WORKSPACE}/src/app.py", "src/app.py"),
        (f"{WORKSPACE}/", "."),
        (f"{WORKSPACE}/../other/x", "/home/dev/other/x"),
        ("/etc/passwd", "/etc/passwd"),
        (f"{WORKSPACE}-evil/x", f"{WORKSPACE}-evil/x"),
    ],
)
def test_paths_are_normalised_lexically(raw: str, normalised: str) -> None:
    assert workspace_path(raw, WORKSPACE) == normalised


def test_absolute_paths_stay_absolute_without_a_workspace() -> None:
    assert workspace_path("/a/./b/../c") == "/a/c"


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("src/**/*.rs", "src/main.rs", True),
        ("src/**/*.rs", "src/a/b/lib.rs", True),
        ("src/**/*.rs", "src/a/b/lib.py", False),
        ("src/**/*.rs", "other/src/main.rs", False),
        ("src/*.rs", "src/main.rs", True),
        ("src/*.rs", "src/a/main.rs", False),
        ("**/*.py", "app.py", True),
        ("**/*.py", "a/b/app.py", True),
        ("*.py", "a/app.py", False),
        ("src/**", "src", True),
        ("src/**", "src/a/b", True),
        ("src/**", "srcx/a", False),
        ("**", ".", True),
        ("**", "a/b/c", True),
        ("./docs/*.md", "docs/README.md", True),
        ("?.txt", "a.txt", True),
        ("?.txt", "ab.txt", False),
        (".env", ".env", True),
        (".env", "xenv", False),
        ("file[1].txt", "file[1].txt", True),
    ],
)
def test_path_globs(pattern: str, path: str, expected: bool) -> None:
    assert matches(f"Read({pattern})", "read_file", path=path) is expected


@pytest.mark.parametrize("path", ["./.env", "src/../.env", f"{WORKSPACE}/.env", "config/../.env"])
def test_path_rules_see_the_normalised_path(path: str) -> None:
    assert matches("Read(.env)", "read_file", "deny", path=path)


def test_paths_escaping_the_workspace_are_not_relative_matches() -> None:
    assert not matches("Read(etc/*)", "read_file", "deny", path="/etc/passwd")
    assert matches("Read(/etc/*)", "read_file", "deny", path="/etc/passwd")
    assert not matches("Edit(*.py)", "edit_file", path="../x.py")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("write_file", {"path": "src/a.py", "content": "x"}),
        ("list_files", {"path": "src"}),
        ("search_files", {"pattern": "*.py", "path": "src/lib"}),
        ("grep", {"pattern": "TODO", "path": "src"}),
        ("find_references", {"symbol": "main", "path": "src/main.py"}),
        ("lint_code", {"path": "src/a.py"}),
        ("git_diff", {"path": "src/a.py"}),
        ("run_script", {"path": "src/migrate.py"}),
    ],
)
def test_file_tools_match_their_path(tool: str, arguments: dict[str, Any]) -> None:
    assert matches(f"{tool}(src/**)", tool, **arguments)
    assert not matches(f"{tool}(docs/**)", tool, **arguments)


def test_a_missing_path_is_the_workspace_root() -> None:
    assert matches("LS(.)", "list_files")
    assert not matches("Git(src/**)", "git_log", max_count=5)


def test_git_commit_paths_must_all_match_to_allow_and_any_to_deny() -> None:
    arguments = {"message": "m", "paths": ["src/a.py", "secrets/key"]}
    assert not matches("Git(src/**)", "git_commit", "allow", **arguments)
    assert matches("Git(secrets/**)", "git_commit", "deny", **arguments)
    assert matches("Git(src/**)", "git_commit", "allow", message="m", paths=["./src/a.py", "src/b.py"])
    assert matches("git_commit(.)", "git_commit", "allow", message="m", all=True)


def test_run_script_code_is_matched_as_text() -> None:
    assert matches("run_script(*print*)", "run_script", language="python", code="print(1)")
    assert not matches("run_script(*.py)", "run_script", language="python", code="print(1)")


# --- web ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://example.com/", True),
        ("https://example.com", True),
        ("http://EXAMPLE.com:8080/x?y=1", True),
        ("https://docs.example.com/a", True),
        ("https://a.b.example.com./", True),
        ("https://evil-example.com/", False),
        ("https://example.com.evil.com/", False),
        ("https://notexample.com/", False),
        ("https://example.com@evil.com/", False),
        ("https://evil.com/?https://example.com", False),
        ("example.com/no-scheme", False),
        ("https://[::1/", False),
        ("", False),
    ],
)
def test_domain_rules_match_the_host_and_its_subdomains(url: str, expected: bool) -> None:
    assert matches("WebFetch(domain:example.com)", "web_fetch", url=url) is expected


def test_domain_rules_are_case_insensitive() -> None:
    assert matches("WebFetch(domain:Example.COM)", "web_fetch", url="https://example.com/")


def test_other_web_fetch_patterns_are_url_globs() -> None:
    assert matches("WebFetch(https://github.com/*)", "web_fetch", url="https://github.com/a/b?c=d")
    assert not matches("WebFetch(https://github.com/*)", "web_fetch", url="http://github.com/a")


def test_web_search_and_ask_user_match_their_text() -> None:
    assert matches("WebSearch(*python*)", "web_search", query="python docs", max_results=3)
    assert not matches("WebSearch(*python*)", "web_search", query="Rust docs")
    assert matches("ask_user(Drop*)", "ask_user", question="Drop support?", options=["yes", "no"])


# --- other tools ----------------------------------------------------------------------------------


def test_other_tools_match_their_arguments_as_sorted_json() -> None:
    arguments = {"target": "prod", "dry_run": False}
    assert json.dumps(arguments, sort_keys=True) == '{"dry_run": false, "target": "prod"}'
    assert matches('deploy(*"target": "prod"*)', "deploy", "deny", **arguments)
    assert not matches('deploy(*"target": "staging"*)', "deploy", "deny", **arguments)
    assert matches("deploy({})", "deploy")


def test_star_rules_use_each_tools_own_matcher() -> None:
    assert matches("*(**secret*)", "read_file", "deny", path="config/secret.txt")
    assert not matches("*(*secret*)", "read_file", "deny", path="config/secret.txt")
    assert matches("*(*secret*)", "bash", "deny", command="cat secret")
    assert matches("*(*secret*)", "deploy", "deny", name="secret")
    assert matches("*(domain:example.com)", "web_fetch", "deny", url="https://x.example.com")


def test_non_string_arguments_do_not_break_matching() -> None:
    assert not matches("Bash(git:*)", "bash", command=["git", "status"])
    assert not matches("Read(src/*)", "read_file", path=None)


# --- evaluation -----------------------------------------------------------------------------------

OVERLAPPING = PermissionPolicy(
    deny=["Bash(rm:*)", "Read(.env)"],
    ask=["Bash(git push:*)", "Bash(rm -i:*)"],
    allow=["Bash(git:*)", "Bash(rm:*)", "Read", "Bash"],
    default_decision="deny",
)


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("bash", {"command": "rm -rf build"}, Evaluation("deny", ("Bash(rm:*)",))),
        ("bash", {"command": "rm -i x"}, Evaluation("deny", ("Bash(rm:*)",))),
        ("bash", {"command": "git push origin"}, Evaluation("ask", ("Bash(git push:*)",))),
        ("bash", {"command": "git status"}, Evaluation("allow", ("Bash(git:*)", "Bash"))),
        ("bash", {"command": "ls"}, Evaluation("allow", ("Bash",))),
        ("read_file", {"path": "./.env"}, Evaluation("deny", ("Read(.env)",))),
        ("read_file", {"path": "src/a.py"}, Evaluation("allow", ("Read",))),
        ("write_file", {"path": "src/a.py"}, Evaluation("deny", ())),
    ],
)
def test_deny_beats_ask_beats_allow(tool: str, arguments: dict[str, Any], expected: Evaluation) -> None:
    assert evaluate(OVERLAPPING, tool, arguments) == expected


WRITERS = PermissionPolicy(
    allow=[
        "Bash(echo:*)",
        "Bash(tee:*)",
        "Bash(cd:*)",
        "Bash(env:*)",
        "Bash(sh:*)",
        "Write(out/**)",
        "Write(/tmp/ok/**)",
    ],
    deny=["Write(**/.env)"],
    default_decision="ask",
)


@pytest.mark.parametrize(
    ("command", "decision"),
    [
        ("echo x", "allow"),
        ("echo x > out/a", "allow"),
        (f"echo x > {WORKSPACE}/out/a", "allow"),
        ("echo x >> out/a 2>&1 >/dev/null", "allow"),
        ("echo x 2>&- >&2", "allow"),
        ("echo x | tee -a out/a /tmp/ok/b", "allow"),
        ("echo x > /tmp/ok/../x", "ask"),
        ("echo x > a", "ask"),
        ("echo x > ../a", "ask"),
        ("echo x > out/../../a", "ask"),
        ("echo x > /etc/a", "ask"),
        ("echo x &> /etc/a", "ask"),
        ("echo x 1<> /etc/a", "ask"),
        ("{ echo x; } > /etc/a", "ask"),
        ("echo x | tee -- -a", "ask"),
        ("echo x > ~/a", "ask"),
        ("echo x > $F", "ask"),
        ("echo x > out/*.txt", "ask"),
        ("cd out && echo x > a", "ask"),
        ("env -C out echo x > a", "ask"),
        ("sh -c 'echo x > /etc/a'", "ask"),
        ("echo x | xargs tee", "ask"),
        ("echo x > .env", "deny"),
        ("echo x | tee out/.env", "deny"),
    ],
)
def test_a_command_is_decided_on_the_files_it_writes(command: str, decision: str) -> None:
    assert evaluate(WRITERS, "bash", {"command": command}, WORKSPACE).decision == decision


def test_a_write_is_relative_to_the_commands_directory() -> None:
    assert evaluate(WRITERS, "bash", {"command": "echo x > a", "cwd": "out"}, WORKSPACE).decision == "allow"
    assert evaluate(WRITERS, "bash", {"command": "echo x > ../a", "cwd": "out"}, WORKSPACE).decision == "ask"


def test_only_an_absolute_pattern_allows_a_path_outside_the_workspace() -> None:
    everywhere = PermissionPolicy(allow=["Bash", "Write", "*"], default_decision="deny")
    assert evaluate(everywhere, "bash", {"command": "echo x > a"}, WORKSPACE).decision == "allow"
    assert evaluate(everywhere, "bash", {"command": "echo x > /etc/a"}, WORKSPACE).decision == "deny"
    rooted = PermissionPolicy(allow=["Bash", "Write(/**)"], default_decision="deny")
    assert evaluate(rooted, "bash", {"command": "echo x > /etc/a"}, WORKSPACE).decision == "allow"


def test_a_bare_bash_rule_does_not_allow_the_writes_of_a_command_it_cannot_read() -> None:
    policy = PermissionPolicy(allow=["Bash", "Write"], default_decision="ask")
    assert evaluate(policy, "bash", {"command": "[[ -d x ]] && echo x"}, WORKSPACE).decision == "ask"
    assert evaluate(policy, "bash", {"command": "true && echo x"}, WORKSPACE).decision == "allow"
    assert evaluate(PermissionPolicy(), "bash", {"command": "[[ -d x ]] > /etc/a"}).decision == "allow"


@pytest.mark.parametrize("default", ["allow", "deny", "ask"])
def test_the_default_decision_applies_when_nothing_matches(default: Any) -> None:
    policy = PermissionPolicy(allow=["Read"], default_decision=default)
    assert evaluate(policy, "bash", {"command": "ls"}) == Evaluation(default, ())


def test_the_default_policy_allows_everything() -> None:
    policy = PermissionPolicy()
    assert policy.enabled and policy.default_decision == "allow"
    assert evaluate(policy, "bash", {"command": "rm -rf /"}) == Evaluation("allow")


def test_a_disabled_policy_allows_everything() -> None:
    policy = PermissionPolicy(deny=["*"], default_decision="deny", enabled=False)
    assert evaluate(policy, "bash", {"command": "rm -rf /"}) == Evaluation("allow", ())


def test_evaluate_takes_the_workspace_for_absolute_paths() -> None:
    policy = PermissionPolicy(deny=["Edit(src/**)"])
    assert evaluate(policy, "edit_file", {"path": f"{WORKSPACE}/src/a.py"}, WORKSPACE).decision == "deny"
    assert evaluate(policy, "edit_file", {"path": f"{WORKSPACE}/src/a.py"}).decision == "allow"


# --- validation, add_rule, serialisation ----------------------------------------------------------


def test_validate_names_the_bad_rule() -> None:
    PermissionPolicy(deny=["Bash(rm:*)"], allow=["Read"], ask=["*"]).validate()
    with pytest.raises(InvalidArgument, match=r"allow\[1\]: permission rule 'Bash\(\)'"):
        PermissionPolicy(allow=["Read", "Bash()"]).validate()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (PermissionPolicy(default_decision="maybe"), "default_decision must be one of allow, deny, ask"),  # type: ignore[arg-type]
        (PermissionPolicy(enabled="yes"), "enabled must be true or false"),  # type: ignore[arg-type]
        (PermissionPolicy(deny="Bash"), "deny must be a list"),  # type: ignore[arg-type]
        (PermissionPolicy(ask=[3]), r"ask\[0\]: permission rule must be a string"),  # type: ignore[list-item]
    ],
)
def test_validate_rejects_bad_fields(policy: PermissionPolicy, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        policy.validate()


def test_add_rule_returns_a_new_policy() -> None:
    policy = PermissionPolicy(deny=["Bash(rm:*)"], default_decision="ask", enabled=False)
    added = add_rule(policy, "Allow", "Bash(git:*)")
    assert added == PermissionPolicy(
        deny=["Bash(rm:*)"], allow=["Bash(git:*)"], default_decision="ask", enabled=False
    )
    assert policy.allow == [] and added.deny is not policy.deny
    assert add_rule(added, "allow", "Bash(git:*)") == added


@pytest.mark.parametrize("rule_type", ["permit", "", "denied"])
def test_add_rule_refuses_an_unknown_rule_type(rule_type: str) -> None:
    with pytest.raises(InvalidArgument, match="rule_type must be one of allow, deny, ask"):
        add_rule(PermissionPolicy(), rule_type, "Bash")


def test_add_rule_refuses_a_malformed_rule() -> None:
    with pytest.raises(InvalidArgument, match="not closed"):
        add_rule(PermissionPolicy(), "deny", "Bash(rm:*")


def test_serialisation_round_trips_through_json() -> None:
    policy = PermissionPolicy(deny=["Bash(rm:*)"], allow=["Read(src/**)"], ask=["*"], default_decision="ask")
    data = json.loads(json.dumps(policy.to_dict()))
    assert PermissionPolicy.from_dict(data) == policy
    assert PermissionPolicy.from_dict({}) == PermissionPolicy()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be an object"),
        ({"deny": ["Bash("]}, r"deny\[0\]"),
        ({"allow": "Bash"}, "allow must be a list"),
        ({"default_decision": "never"}, "default_decision"),
        ({"enabled": 1}, "enabled"),
        ({"rules": []}, "unknown permission policy fields: rules"),
    ],
)
def test_from_dict_refuses_bad_data(data: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        PermissionPolicy.from_dict(data)


def test_from_dict_copies_the_lists() -> None:
    rules = ["Read"]
    policy = PermissionPolicy.from_dict({"allow": rules})
    rules.append("Bash")
    assert policy.allow == ["Read"]


# --- properties -----------------------------------------------------------------------------------

WORDS = st.sampled_from(["git", "gitk", "status", "rm", "-rf", "/", "x", "'a b'", '"c;d"', "$(ls)", "`ls`"])
OPERATORS = st.sampled_from([" && ", " || ", " ; ", " | ", " & ", "\n", " "])
COMMANDS = st.lists(st.tuples(WORDS, OPERATORS), max_size=8).map(
    lambda parts: "".join(w + o for w, o in parts)
)
NAMES = st.sampled_from(["Bash", "Read", "Edit", "Git", "WebFetch", "*", "bash", "deploy"])
PATTERNS = st.text(alphabet="abgitrm */.:-", min_size=1, max_size=12)


def _valid(text: str) -> bool:
    try:
        parse_rule(text)
    except InvalidArgument:
        return False
    return True


RULES = st.one_of(NAMES, st.builds(lambda name, pattern: f"{name}({pattern})", NAMES, PATTERNS)).filter(
    _valid
)


@settings(max_examples=100, deadline=None)
@given(
    prefix=st.sampled_from(["git", "ls", "cargo build"]),
    command=COMMANDS,
    joined=st.sampled_from(["{} && rm x", "{}; rm x", "{} | rm x", "{}\nrm x", "{} $(rm x)", "{} `rm x`"]),
)
def test_a_command_that_also_runs_another_program_is_never_allowed(
    prefix: str, command: str, joined: str
) -> None:
    assert not bash_allows(f"Bash({prefix}:*)", joined.format(command))


@settings(max_examples=100, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["git status", "git", "gitk", "ls", "rm -rf /"]), min_size=1, max_size=5)
)
def test_a_compound_is_allowed_only_when_every_part_is(parts: list[str]) -> None:
    for operator in (" && ", "; ", " | ", "\n"):
        command = operator.join(parts)
        assert bash_allows("Bash(git:*)", command) == all(
            part.startswith("git") and part != "gitk" for part in parts
        )
        assert bash_denies("Bash(rm:*)", command) == ("rm -rf /" in parts)


@settings(max_examples=100, deadline=None)
@given(rule=RULES, command=COMMANDS, path=st.text(alphabet="ab/.", max_size=10))
def test_whatever_an_allow_rule_matches_a_deny_rule_matches(rule: str, command: str, path: str) -> None:
    for tool, arguments in (("bash", {"command": command}), ("read_file", {"path": path})):
        subject = subject_of(tool)
        if parse_rule(rule).matches(tool, arguments, rule_type="allow", subject=subject):
            assert parse_rule(rule).matches(tool, arguments, rule_type="deny", subject=subject)


@settings(max_examples=100, deadline=None)
@given(allow=st.lists(RULES, max_size=5), ask=st.lists(RULES, max_size=5), command=COMMANDS)
def test_deny_always_wins(allow: list[str], ask: list[str], command: str) -> None:
    policy = PermissionPolicy(deny=["Bash(rm:*)"], allow=allow, ask=ask, default_decision="allow")
    result = evaluate(policy, "bash", {"command": f"{command}\nrm -rf /tmp/x"})
    assert result == Evaluation("deny", ("Bash(rm:*)",))


@settings(max_examples=100, deadline=None)
@given(
    deny=st.lists(RULES, max_size=4),
    allow=st.lists(RULES, max_size=4),
    ask=st.lists(RULES, max_size=4),
    default=st.sampled_from(["allow", "deny", "ask"]),
    enabled=st.booleans(),
)
def test_any_valid_policy_round_trips(
    deny: list[str], allow: list[str], ask: list[str], default: Any, enabled: bool
) -> None:
    policy = PermissionPolicy(deny=deny, allow=allow, ask=ask, default_decision=default, enabled=enabled)
    assert PermissionPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


@settings(max_examples=100, deadline=None)
@given(path=st.text(alphabet="ab./", max_size=16))
def test_normalised_paths_have_no_dot_segments_inside(path: str) -> None:
    normalised = workspace_path(path)
    segments = normalised.split("/")
    assert "." not in segments or normalised == "."
    assert ".." not in segments[segments.count("..") :]
    assert "//" not in normalised[2:] and (
        normalised == "/" * len(normalised) or not normalised.endswith("/")
    )

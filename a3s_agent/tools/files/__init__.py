"""The file tools: read, write, edit, delete, list and find files inside the workspace.

- access.py: finding a path beneath the workspace, its failures worded for the model
- read.py: read_file (numbered text windows, images, base64)
- write.py: write_file and delete_file
- edit.py: edit_file, and rewrite_text_file, how the tools that rewrite a text file do it
- find.py: list_files and search_files (globs)

Here: the tools in the order the A3S interface lists them, and what other tools and the ACP face's
editor-routed versions of them use.
"""

from __future__ import annotations

from ..registry import Tool
from .edit import EditFileArgs, apply_edit, check_edit, edit_file, edit_output, rewrite_text_file
from .find import list_files, search_files
from .read import ReadFileArgs, read_file, read_text
from .write import MAX_WRITE_BYTES, WriteFileArgs, delete_file, write_file

TOOLS: list[Tool] = [read_file, write_file, edit_file, delete_file, list_files, search_files]

__all__ = [
    "MAX_WRITE_BYTES",
    "TOOLS",
    "EditFileArgs",
    "ReadFileArgs",
    "WriteFileArgs",
    "apply_edit",
    "check_edit",
    "edit_output",
    "read_file",
    "read_text",
    "rewrite_text_file",
]

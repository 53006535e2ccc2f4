#!/usr/bin/env python3
"""Size check of server/ and client/ sources: files of at most ~450 lines, functions of ~120.

Files: a source file (C++, CUDA, Python) of more than --max-file-lines lines (default 450)
fails unless its header comment (the comment lines before the first line of code) has a line
whose text starts with "Size:" and says why the file is one concept all the same, e.g.
    // Size: one table of flag definitions; splitting it would scatter the flag groups.
Functions: a function body of more than --max-function-lines lines (default 120, from the line
of its opening brace to the line of its closing brace) fails; there is no exemption.

The C++ heuristic (no parser): comments, string and character literals (raw strings too) and
preprocessor lines are blanked first. Braces are then matched; a brace opened at scope level
(outside every function body: the file, a namespace, a class/struct/union body or an
extern "C" block) starts a scope when the text before it (back to the previous ';', '{' or '}')
begins with namespace, class, struct, union or extern, is skipped when that text is an
initializer or enum ('=' in it, or it begins with enum), and is otherwise taken as a function
body and measured. So lambdas and blocks inside a function count toward that function; a
constructor's member initializer with braces (x_{0}) is measured as its own short block, and its
body as the function. Python: every def (methods and nested functions too) from its def line to
its last line (the ast module).

Usage: scripts/check_sizes.py [--root DIR] [--max-file-lines N] [--max-function-lines N]
Exit status: 0 when all pass; 1 with one line per failure ("file:line: ..."); 2 for a bad
argument. Standard-library Python only.
"""

import argparse
import ast
import os
import re
import sys

SCANNED_TOPS = ("server", "client")
CXX_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
PY_SUFFIXES = (".py",)
# _pb: protoc/grpcio-tools output (client/python/attention_client/_pb), generated, not written.
SKIPPED_DIRS = {"__pycache__", "build", "data", "_pb"}
SCOPE_RE = re.compile(r'^\s*(template\s*<[^{]*>\s*)?(namespace|class|struct|union|extern)\b')
ENUM_RE = re.compile(r'^\s*(typedef\s+)?enum\b')


def header_has_size_reason(text, is_py):
    """True when the header comment has a line that starts with 'Size:'.

    C++: the '//' lines at the top of the file (blank lines allowed between them). Python: the
    '#' lines at the top (the shebang included) and the module docstring."""
    marker = "#" if is_py else "//"
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith(marker):
            break
        if stripped[len(marker):].strip().startswith("Size:"):
            return True
    if is_py:
        try:
            doc = ast.get_docstring(ast.parse(text))
        except SyntaxError:
            return False
        return bool(doc) and any(l.strip().startswith("Size:") for l in doc.splitlines())
    return False


def blank_cxx(text):
    """Comments, literals and preprocessor lines replaced by spaces; newlines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # Preprocessor line (with backslash continuations).
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        if c == "\n":
            out.append(c)
            i += 1
            line_start = True
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^ ()\\\t\n]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def cxx_functions(text):
    """[(start line, end line, signature text)] of the function bodies found (see the heuristic)."""
    code = blank_cxx(text)
    found = []
    # Stack entries: (kind, start line, signature): kind is "scope", "skip" or "function".
    stack = []
    segment_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
            continue
        if c not in "{};":
            continue
        in_function = any(kind in ("function", "skip") for kind, _, _ in stack)
        if c == "{":
            segment = code[segment_start:i]
            if in_function:
                kind = "inner"
            elif SCOPE_RE.match(segment):
                kind = "scope"
            elif "=" in segment or ENUM_RE.match(segment):
                kind = "skip"
            else:
                kind = "function"
            stack.append((kind, line, " ".join(segment.split())))
        elif c == "}":
            if stack:
                kind, start, sig = stack.pop()
                if kind == "function":
                    found.append((start, line, sig))
        segment_start = i + 1
    return found


def python_functions(text):
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.lineno, node.end_lineno, "def " + node.name))
    return found


def check_file(path, rel, max_file_lines, max_function_lines):
    failures = []
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    is_py = rel.endswith(PY_SUFFIXES)
    if len(lines) > max_file_lines and not header_has_size_reason(text, is_py):
        failures.append(f"{rel}:1: {len(lines)} lines (over {max_file_lines}) and no 'Size:' "
                        "line in its header comment saying why")
    functions = python_functions(text) if is_py else cxx_functions(text)
    for start, end, sig in functions:
        length = end - start + 1
        if length > max_function_lines:
            shown = sig if len(sig) <= 90 else sig[:87] + "..."
            failures.append(f"{rel}:{start}: function of {length} lines (over "
                            f"{max_function_lines}): {shown}")
    return failures


def scan(root, max_file_lines, max_function_lines):
    failures = []
    for top in SCANNED_TOPS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS
                                 and not d.endswith(".egg-info"))
            for name in sorted(filenames):
                if not name.endswith(CXX_SUFFIXES + PY_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                failures += check_file(path, rel, max_file_lines, max_function_lines)
    return failures


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(here),
                        help="tree to check (holds server/ and client/)")
    parser.add_argument("--max-file-lines", type=int, default=450)
    parser.add_argument("--max-function-lines", type=int, default=120)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        print(f"check_sizes: no such folder: {args.root}", file=sys.stderr)
        return 2
    if args.max_file_lines < 1 or args.max_function_lines < 1:
        print("check_sizes: the limits must be positive", file=sys.stderr)
        return 2
    failures = scan(args.root, args.max_file_lines, args.max_function_lines)
    for f in failures:
        print(f)
    if failures:
        print(f"check_sizes: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("check_sizes: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

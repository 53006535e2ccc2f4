"""scripts/check_sizes.py on small fixture trees written to a temporary folder: long files fail
unless their header comment has a 'Size:' line, long functions fail (C++ brace heuristic and
Python defs), and braces in comments, strings and namespaces do not fool the count."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKER = os.path.join(ROOT, "scripts", "check_sizes.py")


def run_checker(root, *extra):
    return subprocess.run([sys.executable, CHECKER, "--root", str(root), *extra],
                          capture_output=True, text=True, timeout=60)


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cxx_function(name, body_lines):
    """A function whose body spans body_lines + 2 lines (the two brace lines included)."""
    body = "".join(f"  x += {i};\n" for i in range(body_lines))
    return f"int {name}(int x) {{\n{body}  return x;\n}}\n"


def test_short_tree_passes(tmp_path):
    write(tmp_path, "server/a/ok.cc", "// A file.\nnamespace attn {\n" + cxx_function("F", 100)
          + "}  // namespace attn\n")
    r = run_checker(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check_sizes: ok" in r.stdout


def test_long_file_fails_without_a_size_line_and_passes_with_one(tmp_path):
    filler = "".join(f"int v{i} = {i};\n" for i in range(460))
    write(tmp_path, "client/loadgen/big.cc", "// A big file.\n" + filler)
    r = run_checker(tmp_path)
    assert r.returncode == 1
    assert r.stdout.startswith("client/loadgen/big.cc:1: 461 lines (over 450)"), r.stdout
    write(tmp_path, "client/loadgen/big.cc",
          "// A big file.\n// Size: one generated table; split it and the rows drift.\n" + filler)
    r = run_checker(tmp_path)
    assert r.returncode == 0, r.stdout
    # A 'Size:' line below the header comment does not count.
    write(tmp_path, "client/loadgen/big.cc", "// A big file.\n" + filler + "// Size: late\n")
    assert run_checker(tmp_path).returncode == 1


def test_long_function_fails_at_its_opening_line(tmp_path):
    # 118 statement lines + return + the two brace lines = 121 lines.
    text = ("// File.\n#include <string>\nnamespace attn {\nnamespace {\n"
            "struct S {\n  int Small() const { return 1; }\n};\n}  // namespace\n"
            + cxx_function("Long", 118) + "}  // namespace attn\n")
    write(tmp_path, "server/b/long.cc", text)
    r = run_checker(tmp_path)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines == ["server/b/long.cc:9: function of 121 lines (over 120): int Long(int x)"], lines
    # One line shorter passes.
    write(tmp_path, "server/b/long.cc", text.replace("  x += 117;\n", ""))
    assert run_checker(tmp_path).returncode == 0


def test_braces_in_comments_strings_and_lambdas_are_not_functions(tmp_path):
    body = "".join(f"  y += {i};\n" for i in range(60))
    text = ("// File.\n#define OPEN {\n"
            "int F(int y) {\n"
            '  const char* s = "{{";  // {\n'
            "  /* { */\n"
            "  auto f = [&] { return y; };\n"
            + body + "  return f() + s[0] + '{' + R\"x({)x\"[0];\n}\n"
            + "int G(int y) {\n" + body + "  return y;\n}\n"
            "const int kTable[] = {\n" + "".join(f"  {i},\n" for i in range(130)) + "};\n")
    write(tmp_path, "server/c/tricky.cc", text)
    # At a limit of 50, exactly F (line 3, 66 lines) and G (line 69, 63 lines) are reported: a
    # brace in a literal, comment or macro would shift or merge them; the 130-line initializer
    # and the lambda are not functions.
    r = run_checker(tmp_path, "--max-function-lines", "50")
    assert r.stdout.splitlines() == [
        "server/c/tricky.cc:3: function of 66 lines (over 50): int F(int y)",
        "server/c/tricky.cc:69: function of 63 lines (over 50): int G(int y)",
    ], r.stdout
    assert run_checker(tmp_path).returncode == 0


def test_long_python_function_fails(tmp_path):
    body = "".join(f"    x += {i}\n" for i in range(125))
    write(tmp_path, "client/python/pkg/mod.py", '"""Module."""\n\n\ndef f(x):\n' + body
          + "    return x\n")
    r = run_checker(tmp_path)
    assert r.returncode == 1
    assert r.stdout.startswith("client/python/pkg/mod.py:4: function of 127 lines"), r.stdout


def test_limits_are_options_and_bad_ones_are_usage_errors(tmp_path):
    write(tmp_path, "server/a/ok.cc", cxx_function("F", 20))
    assert run_checker(tmp_path, "--max-function-lines", "10").returncode == 1
    assert run_checker(tmp_path, "--max-function-lines", "0").returncode == 2
    assert run_checker(tmp_path / "absent").returncode == 2

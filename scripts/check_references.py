#!/usr/bin/env python3
"""Checks the project's citations.

1. No tracked file cites a document that lives outside the repository (the research notes that
   sit beside it). Sources are cited through docs/REFERENCES.md instead.
2. Every key cited as `REFERENCES.md [KEY]` (or `REFERENCES.md [A], [B] ...`) in code, data, docs
   and tests is defined in docs/REFERENCES.md (an entry starting `- **[KEY]**`), and every key
   that docs/REFERENCES.md itself mentions is defined there.

A citation's keys are the bracketed tokens from `REFERENCES.md` up to the end of that citation:
the first `;`, `)`, `"` or line end.

Usage: check_references.py [--root DIR]   (exit 0: clean, 1: problems, listed one per line)
       check_references.py --self-test    (checks the checker on made-up files)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# Paths of the notes outside the repository. Built from parts so that this file does not match.
_OUTSIDE_NAMES = ["design", "papers", "hardware", "launchers", "implementations", "peers",
                  "aesthetics"]
OUTSIDE_DOC = re.compile(r"(\.\./shared|" + "reference" + "/|(?:"
                         + "|".join(_OUTSIDE_NAMES) + r")\.md)")
KEY = r"[A-Za-z][A-Za-z0-9.+-]*"
CITATION = re.compile(r"REFERENCES\.md([^;)\"\n]*)")
BRACKETED_KEY = re.compile(r"\[(" + KEY + r")\]")
DEFINITION = re.compile(r"^- \*\*\[(" + KEY + r")\]\*\*", re.MULTILINE)
REFERENCES_PATH = os.path.join("docs", "REFERENCES.md")
# This file cites made-up keys in its examples and self-test.
THIS_FILE = os.path.join("scripts", "check_references.py")
SKIP_DIRS = {".git", "build", "shared"}


def tracked_files(root):
    """Files under version control (git ls-files), or every file outside build folders."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        files = [f for f in out.decode("utf-8").split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for name in names:
            files.append(os.path.relpath(os.path.join(base, name), root))
    return files


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def defined_keys(text):
    return set(DEFINITION.findall(text))


def cited_keys(text):
    """(line number, key) of every key cited through REFERENCES.md."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in CITATION.finditer(line):
            for key in BRACKETED_KEY.findall(match.group(1)):
                found.append((number, key))
    return found


def check(root):
    """Problems found under `root`, one string each."""
    problems = []
    references = read_text(os.path.join(root, REFERENCES_PATH))
    if references is None:
        return [f"{REFERENCES_PATH}: missing"]
    defined = defined_keys(references)
    if not defined:
        problems.append(f"{REFERENCES_PATH}: defines no key (entries start '- **[KEY]**')")
    for number, line in enumerate(references.splitlines(), start=1):
        if DEFINITION.match(line):
            line = line.split("**", 2)[2]
        for key in BRACKETED_KEY.findall(line):
            if key not in defined:
                problems.append(f"{REFERENCES_PATH}:{number}: [{key}] is not defined")
    for rel in sorted(tracked_files(root)):
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            match = OUTSIDE_DOC.search(line)
            if match:
                problems.append(f"{rel}:{number}: cites '{match.group(0)}', a document outside "
                                f"the repository; cite a {REFERENCES_PATH} entry")
        if rel not in (REFERENCES_PATH, THIS_FILE):
            for number, key in cited_keys(text):
                if key not in defined:
                    problems.append(f"{rel}:{number}: REFERENCES.md [{key}] is not defined in "
                                    f"{REFERENCES_PATH}")
    return problems


def self_test():
    """The checker finds what it must find and nothing else."""
    good_refs = "# R\n\n- **[A]** Paper A, see also [B].\n- **[B]** Repo B at commit 0123.\n"
    cases = [
        ("clean", good_refs, {"x.cpp": "// REFERENCES.md [A] §2, [B] table 1\n"}, 0),
        ("undefined key", good_refs, {"x.json": '{"source": "REFERENCES.md [C]"}\n'}, 1),
        ("second key undefined", good_refs, {"x.cpp": "// REFERENCES.md [A], [Z] p. 3\n"}, 1),
        ("key after the citation ends is not one", good_refs,
         {"x.cpp": "// (REFERENCES.md [A]) then [N/C, H] and [tmp]\n"}, 0),
        ("outside note", good_refs, {"x.md": "see " + "reference" + "/papers" + ".md §3\n"}, 1),
        ("outside design doc", good_refs, {"CMakeLists.txt": "# (" + "design" + ".md)\n"}, 1),
        ("shared folder", good_refs, {"a.md": "`../" + "shared/docs`\n"}, 1),
        ("undefined key inside REFERENCES.md", good_refs + "- **[D]** like [E].\n", {}, 1),
        ("no definitions", "# R\n", {}, 1),
    ]
    failures = 0
    for name, refs, files, expected in cases:
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            with open(os.path.join(root, REFERENCES_PATH), "w", encoding="utf-8") as f:
                f.write(refs)
            for rel, text in files.items():
                with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            got = len(check(root))
        if got != expected:
            print(f"self-test '{name}': {got} problems, expected {expected}")
            failures += 1
    if failures == 0:
        print(f"self-test: {len(cases)} cases pass")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="repository root (default: this script's parent folder)")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} citation problems")
        return 1
    print("citations: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())

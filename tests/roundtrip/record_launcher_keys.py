#!/usr/bin/env python3
"""Record where each key cpsim's launcher files set is defined in the launcher's own source.

For every launcher: the upstream repository and commit, and for each key the first `path:line`
that defines it there (an argparse flag; a dataclass or pydantic field, which tyro and Megatron's
ArgumentGroupFactory turn into `--section.field` / `--field-name` flags; a config-key string).
Writes tests/roundtrip/launcher_keys.json, which the round-trip test reads: a key an emitted file
sets that is not listed there fails the test, so every key is one its launcher's source defines
at the recorded commit.

  record_launcher_keys.py KEYS.json launcher_sources.json CLONES_DIR > launcher_keys.json

KEYS.json: {launcher: {part: [keys]}} (read_launcher_file.py --list-keys over emitted files);
launcher_sources.json: {launcher: {part: [source, ...]}}, a source being {"repo", "commit",
"clone", "globs", "prefix", "prefer"}: the folder under CLONES_DIR holding a clone of the repository
(any commit: files are read at "commit"), the files to search, the key prefix it answers for
(optional: ArcticTraining's `deepspeed.` section is DeepSpeed's) and the files its top-level keys
live in (optional). Exits 1 naming the keys it cannot find.
"""
import fnmatch
import json
import os
import re
import subprocess
import sys

_texts = {}


def texts(source):
    """{path: text} of the files a source searches, read once."""
    key = (source["clone"], source["commit"], tuple(source["globs"]))
    if key not in _texts:
        files = subprocess.run(["git", "-C", source["clone"], "ls-tree", "-r", "--name-only",
                                source["commit"]], capture_output=True, text=True,
                               check=True).stdout.split()
        chosen = sorted(f for f in files if f.endswith(".py") and
                        any(fnmatch.fnmatch(f, g) for g in source["globs"]))
        _texts[key] = {f: subprocess.run(["git", "-C", source["clone"], "show",
                                          f"{source['commit']}:{f}"], capture_output=True,
                                         text=True).stdout for f in chosen}
    return _texts[key]


def patterns(key, part):
    """What defines a key, most specific first."""
    if part == "args":
        field = key.lstrip("-").split(".")[-1].replace("-", "_")
        return [re.compile(r"""['"]%s['"]""" % re.escape(key)),
                re.compile(r"^\s*%s\s*:" % re.escape(field))]
    leaf = key.split(".")[-1]
    return [re.compile(r"^\s*%s\s*:" % re.escape(leaf)),
            re.compile(r"""['"](--)?%s['"]""" % re.escape(leaf))]


def search_order(key, part, source):
    """The files to search, those named after the key's section (`model.type` → model.py) first,
    then the source's preferred files (`prefer`: where its top-level keys live), then the rest."""
    paths = list(texts(source))
    parts = key.lstrip("-").split(".")
    section = parts[0] if len(parts) > 1 and part != "args" else None
    if section and source.get("prefix") and key.startswith(source["prefix"]):
        section = None
    def rank(path):
        if section and path.rsplit("/", 1)[-1] == f"{section}.py":
            return 0
        if not section and any(path.endswith(p) for p in source.get("prefer", [])):
            return 1
        return 2
    return sorted(paths, key=lambda path: (rank(path), path))


def locate(key, part, source):
    for pattern in patterns(key, part):
        for path in search_order(key, part, source):
            text = texts(source)[path]
            for n, line in enumerate(text.splitlines(), 1):
                if pattern.search(line):
                    return f"{source['repo']}@{source['commit'][:12]} {path}:{n}"
    return None


def main():
    keys = json.load(open(sys.argv[1]))
    sources = json.load(open(sys.argv[2]))
    for parts in sources.values():
        for part_sources in parts.values():
            for source in part_sources:
                source["clone"] = os.path.join(sys.argv[3], source["clone"])
    out, missing = {}, []
    for launcher, parts in sorted(keys.items()):
        entry = {"parts": {}}
        for part, part_keys in sorted(parts.items()):
            found = {}
            for key in sorted(part_keys):
                where = None
                for source in sources[launcher][part]:
                    if key.startswith(source.get("prefix", "")):
                        where = locate(key, part, source)
                        if where:
                            break
                if where is None:
                    missing.append(f"{launcher} {part} {key}")
                else:
                    found[key] = where
            entry["parts"][part] = found
        out[launcher] = entry
    print(json.dumps(out, indent=1, sort_keys=True))
    if missing:
        print("not found: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

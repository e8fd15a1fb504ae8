#!/usr/bin/env python3
"""Counts typed-amp's public surface: what a user of the crate can name from outside it.

    python3 .ci/public_items.py                # the working tree
    python3 .ci/public_items.py 0639743 HEAD   # one column per git revision
    python3 .ci/public_items.py --list HEAD    # also print every public path

It builds rustdoc's JSON description of the library (`cargo rustdoc -p typed-amp --lib` with
`--output-format json`, an unstable rustdoc option, so `RUSTC_BOOTSTRAP=1` on the stable
toolchain; in `target/public-items`, leaving the normal build alone) and walks it from the
crate root the way a user's `use` does: into public modules, through `pub use` (globs
included), counting each path once. Items marked `#[doc(hidden)]` (the definition, the `pub use`
that re-exports it, or a module above it: serde's and thiserror's `__private` pattern) are not a
user's surface: rustdoc is run with `--document-hidden-items` so that they can be counted apart
(the last rows), and the rows above them count only what `cargo doc` shows. The tree (a revision's `git archive`, or the working
tree's files) is exported into `target/public-items/tree` first. Only typed-amp's own items are counted; what
it re-exports from other crates (`dfdx`, `half`, dfdx's prelude globs, the `amp` attribute
macro of typed-amp-macros) is listed apart. Items only (not methods, fields or variants).

Rows:
- public paths: distinct `typed_amp::...` paths that name one of typed-amp's items (a module,
  type, trait, function, constant or macro), each re-export path counted;
- definitions: distinct items those paths name;
- of which traits / modules;
- crate-root re-exports: `pub use` at the crate root (typed-amp's items + other crates');
- prelude, typed-amp names: names `typed_amp::prelude::*` brings in that are typed-amp's items;
- hidden definitions: typed-amp's items reachable only through a `#[doc(hidden)]` item (the
  definition, a re-export or a module on the path), not counted in the rows above; of which traits.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "public-items")
KINDS = {"module", "struct", "enum", "union", "trait", "trait_alias", "function", "type_alias",
         "constant", "static", "macro", "proc_macro"}


def build_json(tree):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", CARGO_TARGET_DIR=TARGET)
    subprocess.run(
        ["cargo", "rustdoc", "-p", "typed-amp", "--lib", "--quiet", "--",
         "-Z", "unstable-options", "--output-format", "json", "--document-hidden-items"],
        cwd=tree, env=env, check=True)
    with open(os.path.join(TARGET, "doc", "typed_amp.json")) as f:
        return json.load(f)


def json_of(rev):
    """Exports the tree (a revision, or the working tree's files) into one fixed directory, with
    fresh modification times so that cargo rebuilds it, and builds its JSON there; the crates.io
    dependencies stay built between runs."""
    tree = os.path.join(TARGET, "tree")
    subprocess.run(["rm", "-rf", tree], check=True)
    os.makedirs(tree)
    if rev is None:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                               check=True, capture_output=True).stdout
        files = b"\0".join(f for f in files.split(b"\0")
                            if f and os.path.isfile(os.path.join(ROOT, os.fsdecode(f))))
        archive = subprocess.run(["tar", "-c", "--null", "-T", "-"], cwd=ROOT, input=files,
                                 check=True, capture_output=True).stdout
    else:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                                 capture_output=True).stdout
    subprocess.run(["tar", "-x", "-m", "-C", tree], input=archive, check=True)
    return build_json(tree)


def kind(item):
    return next(iter(item["inner"]))


def is_hidden(item):
    """Whether the item carries `#[doc(hidden)]` (rustdoc JSON lists it as an `other` attribute;
    older formats as a plain string)."""
    for attr in item.get("attrs", []):
        text = attr.get("other", "") if isinstance(attr, dict) else str(attr)
        if "".join(text.split()) == "#[doc(hidden)]":
            return True
    return False


def walk(doc):
    """Every public path to one of the crate's items: {path: id}, the paths that go through a
    `#[doc(hidden)]` item: {path: id}; and the foreign re-exports (shown ones only)."""
    index = doc["index"]
    paths, hidden, foreign = {}, {}, set()

    def visit_module(module_id, prefix, seen, under_hidden):
        if module_id in seen:  # a glob cycle
            return
        seen = seen | {module_id}
        for child in index[str(module_id)]["inner"]["module"]["items"]:
            item = index[str(child)]
            if item["visibility"] != "public":
                continue
            hide = under_hidden or is_hidden(item)
            if kind(item) == "use":
                use = item["inner"]["use"]
                target = index.get(str(use["id"])) if use["id"] is not None else None
                if target is None or target["crate_id"] != 0:
                    if not hide:
                        foreign.add(f"{'::'.join(prefix)}::{use['name'] if not use['is_glob'] else '*'}"
                                    f" (= {use['source']})")
                    continue
                if use["is_glob"]:
                    visit_module(use["id"], prefix, seen, hide)
                else:
                    add(use["id"], prefix + [use["name"]], seen, hide)
            else:
                add(child, prefix + [item["name"]], seen, hide)

    def add(item_id, path, seen, under_hidden):
        item = index[str(item_id)]
        if kind(item) not in KINDS:
            return
        hide = under_hidden or is_hidden(item)
        (hidden if hide else paths).setdefault("::".join(path), item_id)
        if kind(item) == "module":
            visit_module(item_id, path, seen, hide)

    visit_module(doc["root"], ["typed_amp"], frozenset(), False)
    return paths, hidden, foreign


def count(doc):
    index = doc["index"]
    paths, hidden, foreign = walk(doc)
    ids = set(paths.values())
    hidden_ids = set(hidden.values()) - ids
    root_uses = [index[str(c)] for c in index[str(doc["root"])]["inner"]["module"]["items"]
                 if kind(index[str(c)]) == "use" and index[str(c)]["visibility"] == "public"
                 and not is_hidden(index[str(c)])]
    local_root = [u for u in root_uses if str(u["inner"]["use"]["id"]) in index
                  and index[str(u["inner"]["use"]["id"])]["crate_id"] == 0]
    prelude = sorted(p for p in paths if p.startswith("typed_amp::prelude::"))
    return {
        "public paths": len(paths),
        "definitions": len(ids),
        "  of which traits": sum(kind(index[str(i)]) == "trait" for i in ids),
        "  of which modules": sum(kind(index[str(i)]) == "module" for i in ids),
        "crate-root re-exports of typed-amp items": len(local_root),
        "crate-root re-exports of other crates'": len(root_uses) - len(local_root),
        "prelude, typed-amp names": len(prelude),
        "hidden definitions (#[doc(hidden)], not above)": len(hidden_ids),
        "  of which traits ": sum(kind(index[str(i)]) == "trait" for i in hidden_ids),
    }, paths, hidden, foreign


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revs", nargs="*", help="git revisions (default: the working tree)")
    parser.add_argument("--list", action="store_true", help="print every public path")
    args = parser.parse_args()
    revs = args.revs or [None]
    columns = []
    for rev in revs:
        rows, paths, hidden, foreign = count(json_of(rev))
        columns.append(rows)
        if args.list:
            print(f"# {rev or 'working tree'}")
            for p in sorted(paths):
                print(p)
            for f in sorted(foreign):
                print(f"{f}  [other crate]")
            for p in sorted(hidden):
                print(f"{p}  [doc(hidden)]")
    names = [rev or "working tree" for rev in revs]
    width = max(len(k) for k in columns[0])
    print(f"{'':{width}}  " + "  ".join(f"{n:>12}" for n in names))
    for key in columns[0]:
        print(f"{key:{width}}  " + "  ".join(f"{c[key]:>12}" for c in columns))


if __name__ == "__main__":
    sys.exit(main())

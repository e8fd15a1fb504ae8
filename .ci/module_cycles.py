#!/usr/bin/env python3
"""Import cycles between the modules of a crate of the workspace (default: typed-amp's src/),
and between the folders that hold them.

The graph has a node per module file (src/lib.rs is `crate`, src/tape.rs is `tape`,
src/ops/cast/mod.rs is `ops::cast`) and an edge A -> B for each path in A that names B: the
leaves of `use crate::...` declarations, `crate::B::...` paths in code, and paths relative to A
(`super::`, `self::`, a child module A declares, a module A imported), each attributed to the
deepest module that exists as a file (`crate::ops::cast::Cast` -> `ops::cast`). A path through
a `use` re-export is followed to the module the item comes from (`crate::prelude::AmpError` ->
`error`, not lib.rs; `super::Paired` in master/copy.rs -> `master::pair`; a `#[macro_export]` macro ->
the module defining it), while the re-exporting `use` line stays an edge of its own; without
that, lib.rs's prelude, which re-exports from most modules, would put nearly every module on a cycle
(`--literal` shows that graph). Paths into other crates (`crate::dfdx::..`) are not edges.
Comments (doc comments included), string literals, `pub(in path)` visibilities and items under
`#[cfg(test)]` (the `mod tests` blocks) are not read; modules declared under `#[cfg(test)]` are
not nodes.

Folders: within each folder (src/ included), its entries (each sub-folder with every module file
under it, and each file; the folder's own mod.rs, or the `x.rs` beside folder `x/`, is the folder
itself, one level up) must import one another in no circle, so that a folder imports only
folders below it. An import from a file under entry `a` to a file under entry `b` of the same
folder is an edge `a -> b` there; every circle is printed with the imports that close it, and
fails (the allow file does not apply to folders). A binary's main.rs beside lib.rs is a crate of
its own and is not read.

For each strongly connected component of more than one module it prints one concrete cycle, the
edges "running back up" (a set of edges whose removal leaves the component without a cycle,
each from a module to one that transitively imports it, chosen with the fewest references:
exact up to 16 modules, a greedy order improved by moves beyond), with the `use` lines behind
them. Exit status 1 if there is a cycle (between files or folders), 0 otherwise; with --allow, 1 only
for a new file cycle, a listed cycle that is gone, or any folder cycle; 2 for a malformed allow
file.

    python3 .ci/module_cycles.py [--src DIR] [--allow FILE] [--write-allow] [--dot] [-v]

--allow FILE   known cycles, one per line as `a -> b -> c -> a` (`#` starts a comment). An edge
               that lies on a cycle today but on no listed cycle means a new cycle (a cycle made
               only of edges the listed cycles take existed when the list was written), and fails;
               a listed cycle that no longer exists fails too, so that the list only shrinks.
--write-allow  print today's cycles in that format: for each component, cycles that together
               take every edge of it
--dot          print the graph in Graphviz's DOT format (cycle edges red, labelled with their
               number of references) instead of the report
--literal      do not follow re-exports (every path goes to the deepest module file it names)
-v             list every edge of each component, and every new edge with a cycle through it

Python 3 standard library only.
"""

import argparse
import os
import sys
from collections import defaultdict

ROOT = "crate"
MAX_CYCLES = 20000

# ---------------------------------------------------------------------------------------------
# Lexer: identifiers, punctuation and literals with line numbers; comments and the contents of
# literals are dropped.


def lex(text):
    toks = []
    i, n, line = 0, len(text), 1

    def add(kind, value, ln):
        toks.append((kind, value, ln))

    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += text[i] == "\n"
                    i += 1
        elif c in "rbc" and _raw_string_at(text, i):
            start = line
            j = i + (2 if text[i : i + 2] in ("br", "cr") else 1)
            hashes = 0
            while text[j] == "#":
                hashes, j = hashes + 1, j + 1
            close = '"' + "#" * hashes
            k = text.find(close, j + 1)
            k = n if k < 0 else k + len(close)
            line += text.count("\n", i, k)
            i = k
            add("lit", "str", start)
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            start = line
            i += 1 if c == '"' else 2
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                line += text[i] == "\n"
                i += 1
            i += 1
            add("lit", "str", start)
        elif c == "'" or (c == "b" and text.startswith("'", i + 1)):
            j = i + (1 if c == "'" else 2)
            if j < n and text[j] == "\\":  # escaped char literal: '\n', '\'', '\u{..}'
                k = j + 2
                while k < n and text[k] != "'":
                    k += 1
                i = k + 1
                add("lit", "char", line)
            elif j + 1 < n and text[j + 1] == "'":  # 'x'
                i = j + 2
                add("lit", "char", line)
            else:  # a lifetime or label
                k = j
                while k < n and (text[k].isalnum() or text[k] == "_"):
                    k += 1
                add("lifetime", text[j:k], line)
                i = k
        elif c.isdigit():
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            if j + 1 < n and text[j] == "." and text[j + 1].isdigit():
                j += 1
                while j < n and (text[j].isalnum() or text[j] == "_"):
                    j += 1
            add("lit", "num", line)
            i = j
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if word == "r" and text.startswith("#", j) and j + 1 < n and (text[j + 1].isalpha() or text[j + 1] == "_"):
                k = j + 1  # raw identifier r#name
                while k < n and (text[k].isalnum() or text[k] == "_"):
                    k += 1
                word, j = text[j + 1 : k], k
            add("id", word, line)
            i = j
        elif text.startswith("::", i):
            add("p", "::", line)
            i += 2
        else:
            add("p", c, line)
            i += 1
    return toks


def _raw_string_at(text, i):
    """A raw string literal (r"..", r#".."#, br"..", cr"..") starts at text[i]."""
    if text[i] == "r":
        j = i + 1
    elif text[i : i + 2] in ("br", "cr"):
        j = i + 2
    else:
        return False
    while j < len(text) and text[j] == "#":
        j += 1
    return j < len(text) and text[j] == '"'


# ---------------------------------------------------------------------------------------------
# Modules and references


def module_files(src):
    """{module path tuple: file path} for every .rs file under src (lib.rs is the root)."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src).replace(os.sep, "/")
            parts = rel[:-3].split("/")
            if parts == ["main"] and dirpath == src and os.path.exists(os.path.join(src, "lib.rs")):
                continue  # a binary beside the library: a crate of its own, which imports the library
            if parts == ["lib"] or parts == ["main"]:
                parts = []
            elif parts[-1] == "mod":
                parts = parts[:-1]
            mods[tuple(parts)] = full
    return mods


def name(mod):
    return "::".join(mod) if mod else ROOT


def cfg_test_only(toks, i):
    """toks[i] is `cfg` inside an attribute: is its predicate true only under test?"""

    def pred(j):  # -> (test_only, next index)
        kind, val, _ = toks[j]
        if kind == "id" and j + 1 < len(toks) and toks[j + 1][1] == "(":
            children, k = [], j + 2
            while toks[k][1] != ")":
                t, k = pred(k)
                children.append(t)
                if toks[k][1] == ",":
                    k += 1
            if val == "all":
                return any(children), k + 1
            return False, k + 1
        # `test`, `feature = "x"`, ...
        k = j + 1
        if k < len(toks) and toks[k][1] == "=":
            k += 2
        return (kind == "id" and val == "test" and toks[j + 1][1] != "="), k

    if i + 1 < len(toks) and toks[i + 1][1] == "(":
        return pred(i + 2)[0]
    return False


def skip_item(toks, i):
    """Index after the item starting at toks[i]: its `;` or its outermost `{...}` block."""
    depth = 0
    while i < len(toks):
        v = toks[i][1]
        if toks[i][0] == "p":
            if v in ("(", "["):
                depth += 1
            elif v in (")", "]"):
                depth -= 1
            elif v == ";" and depth == 0:
                return i + 1
            elif v == "{" and depth == 0:
                j, d = i, 0
                while j < len(toks):
                    if toks[j][0] == "p" and toks[j][1] == "{":
                        d += 1
                    elif toks[j][0] == "p" and toks[j][1] == "}":
                        d -= 1
                        if d == 0:
                            return j + 1
                    j += 1
                return j
        i += 1
    return i


def use_paths(toks, i):
    """Expand the use tree starting at toks[i] (just after `use`): a (segments, alias, line)
    per leaf (alias None for a glob `*`, the last segment when not renamed), and the index
    after its `;`."""
    out = []

    def tree(j, prefix):
        segs = list(prefix)
        if toks[j][1] == "::":  # `use ::extern_crate::..`
            segs.append("::")
            j += 1
        while True:
            kind, val, ln = toks[j]
            if kind == "p" and val == "{":
                j += 1
                while toks[j][1] != "}":
                    j = tree(j, segs)
                    if toks[j][1] == ",":
                        j += 1
                return j + 1
            if kind == "p" and val == "*":
                out.append((segs, None, ln))
                return j + 1
            if kind == "p" and val == "$":  # `$crate` in a macro
                j += 1
                continue
            if kind != "id":
                return j + 1
            segs = segs + [val]
            j += 1
            if toks[j][1] == "::":
                j += 1
                continue
            alias = segs[-1] if segs[-1] != "self" else (segs[-2] if len(segs) > 1 else None)
            if toks[j][1] == "as":
                alias = toks[j + 1][1]
                j += 2
            out.append((segs, alias, ln))
            return j

    j = tree(i, [])
    while j < len(toks) and toks[j][1] != ";":
        j += 1
    return out, j + 1


ITEM_KEYWORDS = {"struct", "enum", "trait", "type", "fn", "const", "static", "union"}


class FileScan:
    """What one module file says, by scope (the file's module or an inline `mod` in it):
    the paths it names, its `use` imports, the items and child modules it defines."""

    def __init__(self, mod, toks):
        self.mod = mod
        self.refs = []  # (scope, raw segments, line, line of its `use` keyword or None)
        self.imports = defaultdict(dict)  # scope -> {name: (scope, raw segments)}
        self.defined = defaultdict(set)  # scope -> item names
        self.children = defaultdict(set)  # scope -> child module names
        self.scopes = {mod}
        self.macro_exports = set()  # #[macro_export] macro names (they live at the crate root)
        self.test_children = set()  # modules declared under #[cfg(test)]
        self.test_only = False
        self._scan(toks)

    def _scan(self, toks):
        ctx = list(self.mod)
        stack = []  # brace depth of each open inline module's body
        depth = 0
        pending_test = False
        i, n = 0, len(toks)
        while i < n:
            kind, val, ln = toks[i]
            at_module_level = depth == (stack[-1] + 1 if stack else 0)
            scope = tuple(ctx)
            if kind == "p" and val == "#":
                inner = i + 1 < n and toks[i + 1][1] == "!"
                j = i + (2 if inner else 1)
                if j < n and toks[j][1] == "[":
                    k, d, test = j, 0, False
                    while k < n:
                        if toks[k][1] == "[":
                            d += 1
                        elif toks[k][1] == "]":
                            d -= 1
                            if d == 0:
                                break
                        elif k == j + 1 and toks[k][1] == "cfg" and cfg_test_only(toks, k):
                            test = True
                        k += 1
                    if test and inner and not stack:
                        self.test_only = True
                        return
                    pending_test = pending_test or test
                    i = k + 1
                    continue
            if pending_test:  # skip the #[cfg(test)] item (the `mod tests` block)
                pending_test = False
                j = i
                if toks[j][1] == "pub":
                    j += 1
                    if toks[j][1] == "(":
                        while toks[j][1] != ")":
                            j += 1
                        j += 1
                if toks[j][1] == "mod" and j + 2 < n and toks[j + 2][1] == ";":
                    self.test_children.add(scope + (toks[j + 1][1],))
                i = skip_item(toks, i)
                continue
            if kind == "id" and val == "mod" and i + 2 < n and toks[i + 1][0] == "id":
                self.children[scope].add(toks[i + 1][1])
                if toks[i + 2][1] == "{":
                    stack.append(depth)
                    ctx.append(toks[i + 1][1])
                    self.scopes.add(tuple(ctx))
                    depth += 1
                    i += 3
                    continue
                i += 2
                continue
            if kind == "p" and val == "{":
                depth += 1
            elif kind == "p" and val == "}":
                depth -= 1
                if stack and stack[-1] == depth:
                    stack.pop()
                    ctx.pop()
            elif kind == "id" and val == "in" and i >= 2 and toks[i - 1][1] == "(" and toks[i - 2][1] == "pub":
                while toks[i][1] != ")":  # pub(in path): a visibility, not a reference
                    i += 1
            elif kind == "id" and val == "macro_rules" and i + 2 < n and toks[i + 1][1] == "!":
                self.defined[scope].add(toks[i + 2][1])
                k = i - 1
                while k >= 0 and toks[k][1] not in (";", "}", "{"):
                    if toks[k][1] == "macro_export":
                        self.macro_exports.add(toks[i + 2][1])
                    k -= 1
            elif kind == "id" and val in ITEM_KEYWORDS and at_module_level and i + 1 < n and toks[i + 1][0] == "id":
                self.defined[scope].add(toks[i + 1][1])
            elif kind == "id" and val == "use" and (i == 0 or toks[i - 1][1] != "::"):
                leaves, i = use_paths(toks, i + 1)
                for segs, alias, line in leaves:
                    self.refs.append((scope, segs, line, ln))
                    if at_module_level and alias is not None:
                        self.imports[scope][alias] = (scope, segs)
                continue
            elif (
                kind == "id"
                and i + 2 < n
                and toks[i + 1][1] == "::"
                and toks[i + 2][0] == "id"
                and (i == 0 or toks[i - 1][1] not in ("::", "."))
            ):
                segs, j = [val], i + 1
                while j + 1 < n and toks[j][1] == "::" and toks[j + 1][0] == "id":
                    segs.append(toks[j + 1][1])
                    j += 2
                self.refs.append((scope, segs, ln, None))
                i = j
                continue
            i += 1


class Crate:
    """Name resolution across the crate's module files, as far as paths need it."""

    def __init__(self, src, follow_reexports=True):
        self.files = module_files(src)
        self.scans = {}
        self.lines = {}
        for mod, path in sorted(self.files.items()):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            self.lines[mod] = text.splitlines()
            self.scans[mod] = FileScan(mod, lex(text))
        excluded = set()
        for mod, scan in self.scans.items():
            if scan.test_only:
                excluded.add(mod)
            excluded |= scan.test_children
        self.nodes = {m for m in self.files if not any(m[: len(x)] == x for x in excluded)}
        self.follow = follow_reexports
        self.imports, self.defined, self.children, self.scopes = {}, {}, {}, set()
        self.macro_home = {}
        for mod, scan in self.scans.items():
            self.scopes |= scan.scopes
            for d, src_ in ((self.imports, scan.imports), (self.defined, scan.defined), (self.children, scan.children)):
                for k, v in src_.items():
                    d[k] = v
            for m in scan.macro_exports:
                self.macro_home[m] = mod

    def absolute(self, scope, segs, depth=0):
        """Absolute segments of a path written in `scope`, or None (another crate, a local name)."""
        if not segs or depth > 20:
            return None
        head = segs[0]
        if head == "crate":
            return list(segs[1:])
        if head in ("self", "super"):
            base, rest = list(scope), list(segs)
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                rest = rest[1:]
            return base + rest
        if head in self.children.get(scope, ()) or head in self.defined.get(scope, ()):
            return list(scope) + list(segs)
        imp = self.imports.get(scope, {}).get(head)
        if imp is not None and imp[1] != segs:
            target = self.absolute(imp[0], imp[1], depth + 1)
            if target is not None:
                return target + list(segs[1:])
        return None

    def names_a_module(self, scope, segs):
        """A path in code (not in `use`) is a module reference when its first segment is
        `crate`, `self`, `super`, a child module or an imported module."""
        head = segs[0]
        if head in ("crate", "self", "super") or head in self.children.get(scope, ()):
            return True
        imp = self.imports.get(scope, {}).get(head)
        if imp is None:
            return False
        target = self.absolute(imp[0], imp[1])
        return target is not None and tuple(target) in self.scopes

    def home(self, absolute):
        """The module file an absolute path ends up in: the deepest module file on the path,
        following `use` re-exports (lib.rs's and a mod.rs's facades, macros exported to the crate
        root) to the module the item comes from."""
        segs, seen = list(absolute), set()
        while self.follow:
            k = len(segs)
            while k > 0 and tuple(segs[:k]) not in self.scopes:
                k -= 1
            if k == len(segs):
                break
            scope, item = tuple(segs[:k]), segs[k]
            if item in self.defined.get(scope, ()) or item in self.children.get(scope, ()):
                break
            if scope == () and item in self.macro_home:
                segs = list(self.macro_home[item]) + segs[k:]
                break
            imp = self.imports.get(scope, {}).get(item)
            if imp is None or (scope, item) in seen:
                break
            seen.add((scope, item))
            target = self.absolute(imp[0], imp[1])
            if target is None:  # another crate's item, re-exported (`crate::dfdx::..`)
                return None
            segs = target + segs[k + 1 :]
        for k in range(len(segs), -1, -1):
            if tuple(segs[:k]) in self.nodes:
                return tuple(segs[:k])
        return None


def build_graph(src, follow_reexports=True):
    crate = Crate(src, follow_reexports)
    edges = defaultdict(list)  # (a, b) -> [(file, line, text)]
    for mod, scan in sorted(crate.scans.items()):
        if mod not in crate.nodes:
            continue
        for scope, segs, line, use_line in scan.refs:
            if use_line is None and not crate.names_a_module(scope, segs):
                continue
            absolute = crate.absolute(scope, segs)
            if absolute is None:
                continue
            target = crate.home(absolute)
            if target is None or target == mod:
                continue
            lines = crate.lines[mod]
            text = lines[line - 1].strip()
            if use_line is not None and use_line != line:  # a leaf of a use tree over several lines
                line, text = use_line, f"{lines[use_line - 1].strip()} .. {'::'.join(segs)}"
            entry = (crate.files[mod], line, text)
            if entry not in edges[(mod, target)]:
                edges[(mod, target)].append(entry)
    return crate.nodes, edges


def folder_edges(nodes, edges):
    """The graph one level down in each folder: {folder: {(entry a, entry b): [file edge]}}.

    A folder's entries are what it holds, each a sub-folder (with every module file under it) or
    a file; the folder's own module file (its mod.rs, or the `x.rs` beside folder `x/`) is none of
    them: it is the folder, one level up. An import from a module under entry `a` to a module
    under entry `b` of the same folder is an edge `a -> b` there. A folder imports only folders
    below it when no folder's graph has a cycle (files have no cycle either: see the file graph)."""
    out = defaultdict(lambda: defaultdict(list))
    for (a, b), refs in edges.items():
        k = 0
        while k < len(a) and k < len(b) and a[k] == b[k]:
            k += 1
        # a and b share the folder a[:k]; both must lie strictly below it, in different entries
        if k < len(a) and k < len(b):
            out[a[:k]][(a[k], b[k])].append(((a, b), refs))
    return out


def folder_cycles(nodes, edges):
    """[(folder, component, one cycle of entries, {entry edge: [(file edge, refs)]})] for every
    folder whose entries import each other in a circle."""
    found = []
    for folder, fedges in sorted(folder_edges(nodes, edges).items()):
        succ = defaultdict(set)
        entries = set()
        for a, b in fedges:
            succ[a].add(b)
            entries |= {a, b}
        for comp in sccs(entries, succ):
            if len(comp) < 2:
                continue
            members = set(comp)
            # a shortest cycle through the component's first entry (entries are names, not tuples)
            prev, frontier, seen, cyc = {}, [comp[0]], {comp[0]}, None
            while frontier and cyc is None:
                nxt = []
                for v in frontier:
                    for w in sorted(succ[v]):
                        if w == comp[0]:
                            path = [v]
                            while path[-1] != comp[0]:
                                path.append(prev[path[-1]])
                            cyc = list(reversed(path)) + [comp[0]]
                            break
                        if w in members and w not in seen:
                            seen.add(w)
                            prev[w] = v
                            nxt.append(w)
                    if cyc:
                        break
                frontier = nxt
            inside = {e: r for e, r in fedges.items() if e[0] in members and e[1] in members}
            found.append((folder, comp, cyc, inside))
    return found


# ---------------------------------------------------------------------------------------------
# Graph algorithms


def sccs(nodes, succ):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def shortest_path(succ, members, src, dst):
    """A shortest path src -> ... -> dst inside `members` (breadth first, names in order)."""
    prev, frontier, seen = {}, [src], {src}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(succ[v], key=name):
                if w == dst:
                    path = [v]
                    while path[-1] != src:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [dst]
                if w in members and w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return None


def cycle_through(succ, members, a, b):
    """A shortest cycle that takes the edge a -> b."""
    back = shortest_path(succ, members, b, a)
    return [a] + back if b != a else [a, a]


def back_edges(comp, weight):
    """A minimum-weight feedback arc set of the component: order its modules so that a module
    comes after the modules it imports, keeping the references that go the other way (from a
    module to one placed after it, i.e. one that transitively imports it) as light as possible.
    Exact over subsets up to 16 modules, greedy (Eades-Lin-Smyth) beyond."""
    n = len(comp)
    idx = {m: k for k, m in enumerate(comp)}
    w = [[0] * n for _ in range(n)]
    for (a, b), c in weight.items():
        if a in idx and b in idx:
            w[idx[a]][idx[b]] = c
    if n <= 16:
        full = (1 << n) - 1
        best = [None] * (1 << n)
        choice = [0] * (1 << n)
        best[0] = 0
        # placing v after the set S: edges from S to v point forward (an earlier module imports a
        # later one) and run back up
        for s in range(1 << n):
            if best[s] is None:
                continue
            for v in range(n):
                if s >> v & 1:
                    continue
                cost = best[s] + sum(w[u][v] for u in range(n) if s >> u & 1)
                t = s | 1 << v
                if best[t] is None or cost < best[t]:
                    best[t], choice[t] = cost, v
        order, s = [], full
        while s:
            v = choice[s]
            order.append(v)
            s &= ~(1 << v)
        order.reverse()
    else:
        remaining, left, right = set(range(n)), [], []
        while remaining:
            changed = True
            while changed:
                changed = False
                for v in sorted(remaining):
                    if not any(w[v][u] for u in remaining if u != v):  # imports nothing left: first
                        left.append(v)
                        remaining.discard(v)
                        changed = True
                    elif not any(w[u][v] for u in remaining if u != v):  # imported by none: last
                        right.insert(0, v)
                        remaining.discard(v)
                        changed = True
            if remaining:
                v = max(
                    sorted(remaining),
                    key=lambda v: sum(w[u][v] for u in remaining) - sum(w[v][u] for u in remaining),
                )
                left.append(v)
                remaining.discard(v)
        order = left + right
        if n <= 80:  # then move single modules while that lightens the back edges
            def cost(o):
                p = {v: k for k, v in enumerate(o)}
                return sum(w[a][b] for a in range(n) for b in range(n) if w[a][b] and p[a] < p[b])

            best_cost, improved = cost(order), True
            while improved:
                improved = False
                for v in range(n):
                    rest = [u for u in order if u != v]
                    for k in range(n):
                        cand = rest[:k] + [v] + rest[k:]
                        c = cost(cand)
                        if c < best_cost:
                            order, best_cost, improved = cand, c, True
                            break
    pos = {v: k for k, v in enumerate(order)}
    out = [(comp[a], comp[b]) for a in range(n) for b in range(n) if w[a][b] and pos[a] < pos[b]]
    return sorted(out, key=lambda e: (name(e[0]), name(e[1])))


def elementary_cycles(comp, succ, limit):
    """Johnson's algorithm restricted to one component; None when there are more than `limit`."""
    order = sorted(comp, key=name)
    found = []
    for k, s in enumerate(order):
        allowed = set(order[k:])
        blocked, bmap, path = set(), defaultdict(set), [s]

        def unblock(u):
            todo = [u]
            while todo:
                x = todo.pop()
                if x in blocked:
                    blocked.discard(x)
                    todo.extend(bmap[x])
                    bmap[x].clear()

        blocked.add(s)
        stack = [(s, iter(sorted((x for x in succ[s] if x in allowed), key=name)), False)]
        while stack:
            v, it, closed = stack[-1]
            for x in it:
                if x == s:
                    found.append(list(path) + [s])
                    if len(found) > limit:
                        return None
                    stack[-1] = (v, it, True)
                    closed = True
                elif x not in blocked:
                    path.append(x)
                    blocked.add(x)
                    stack.append((x, iter(sorted((y for y in succ[x] if y in allowed), key=name)), False))
                    break
            else:
                stack.pop()
                if closed:
                    unblock(v)
                else:
                    for x in succ[v]:
                        if x in allowed:
                            bmap[x].add(v)
                path.pop()
                if stack:
                    u, uit, uclosed = stack[-1]
                    stack[-1] = (u, uit, uclosed or closed)
    return found


def read_allow(path):
    """The cycles the allow file lists: [(line number, [module names])]."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p.strip() for p in line.split("->")]
            if len(parts) < 3 or parts[0] != parts[-1] or not all(parts):
                print(f"{path}:{n}: not a cycle `a -> b -> a`: {raw.strip()}", file=sys.stderr)
                sys.exit(2)
            out.append((n, parts))
    return out


def covering_cycles(comps, succ):
    """Cycles that together take every edge of every component, shortest first found."""
    out = []
    for c in comps:
        members, covered, lines = set(c), set(), []
        for a in sorted(c, key=name):
            for b in sorted(succ[a], key=name):
                if b in members and (a, b) not in covered:
                    cyc = cycle_through(succ, members, a, b)
                    covered |= set(zip(cyc, cyc[1:]))
                    lines.append(cyc)
        out.append(lines)
    return out


# ---------------------------------------------------------------------------------------------


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.join(here, "..", "src"), help="the crate's src/ (default: ../src)")
    ap.add_argument("--allow", metavar="FILE", help="known cycles, one per line: a -> b -> a")
    ap.add_argument("--dot", action="store_true", help="print the graph in DOT instead of the report")
    ap.add_argument("--write-allow", action="store_true", help="print today's cycles in the allow file's format")
    ap.add_argument("--literal", action="store_true", help="do not follow `use` re-exports")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every edge of each cycle's component")
    args = ap.parse_args()

    src = os.path.normpath(args.src)
    top = os.path.dirname(os.path.abspath(src))
    nodes, edges = build_graph(src, follow_reexports=not args.literal)

    def where(ref):
        f, line, text = ref
        return f"{os.path.relpath(f, top)}:{line}: {text}"

    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    comps = [c for c in sccs(nodes, succ) if len(c) > 1]
    comps.sort(key=lambda c: (-len(c), [name(m) for m in c]))
    comp_of = {m: k for k, c in enumerate(comps) for m in c}
    cycle_edges = {(a, b) for (a, b) in edges if a in comp_of and comp_of.get(b) == comp_of[a]}
    weight = {e: len(refs) for e, refs in edges.items()}
    by_name = {name(m): m for m in nodes}

    if args.dot:
        print("digraph modules {")
        print("  rankdir=LR;")
        print("  node [shape=box, fontname=monospace];")
        for m in sorted(nodes, key=name):
            attr = " [color=red]" if m in comp_of else ""
            print(f'  "{name(m)}"{attr};')
        for a, b in sorted(edges, key=lambda e: (name(e[0]), name(e[1]))):
            attr = f' [color=red, label="{weight[(a, b)]}"]' if (a, b) in cycle_edges else ""
            print(f'  "{name(a)}" -> "{name(b)}"{attr};')
        print("}")
        return 1 if comps else 0

    if args.write_allow:
        print("# Import cycles between typed-amp's modules (python3 .ci/module_cycles.py --write-allow):")
        print("# together they take every edge that lies on a cycle today. A cycle that needs an edge")
        print("# none of these takes is new, and fails CI; a line whose cycle is gone fails too, so the")
        print("# list only shrinks (regenerate it after removing a cycle).")
        for c, lines in zip(comps, covering_cycles(comps, succ)):
            print(f"\n# {len(c)} modules: {', '.join(name(m) for m in c)}")
            for cyc in lines:
                print(" -> ".join(name(m) for m in cyc))
        return 0

    # Which edges on cycles no listed cycle takes (new cycles), and which listed cycles are gone.
    allowed_edges, stale = set(), []
    if args.allow:
        for n, parts in read_allow(args.allow):
            mods = [by_name.get(p) for p in parts]
            pairs = list(zip(mods, mods[1:]))
            if None in mods or any(e not in edges for e in pairs):
                stale.append((n, " -> ".join(parts)))
            allowed_edges |= {e for e in pairs if e in edges}
    new_edges = cycle_edges - allowed_edges

    print(f"{len(nodes)} modules, {len(edges)} import edges in {os.path.relpath(src)}")
    if not comps:
        print("no import cycles")
    for k, c in enumerate(comps):
        members = set(c)
        fresh = sorted((e for e in new_edges if e[0] in members), key=lambda e: (name(e[0]), name(e[1])))
        fresh = fresh if args.allow else []
        status = f"NEW: {len(fresh)} edge(s) on no listed cycle" if fresh else "allowed"
        if not args.allow:
            status = "no allow file"
        found = elementary_cycles(c, succ, MAX_CYCLES)
        count = f"more than {MAX_CYCLES}" if found is None else str(len(found))
        print(f"\ncomponent {k + 1} ({status}): {len(c)} modules, {count} elementary cycles")
        print(f"  modules: {', '.join(name(m) for m in c)}")
        cyc = shortest_path(succ, members, c[0], c[0])
        print(f"  one cycle: {' -> '.join(name(m) for m in cyc)}")
        for a, b in zip(cyc, cyc[1:]):
            print(f"    {name(a)} -> {name(b)}: {where(edges[(a, b)][0])}")
        back = back_edges(c, weight)
        print(
            "  back edges (each from a module to one that transitively imports it; together the"
            " fewest references whose removal leaves no cycle here):"
        )
        for a, b in back:
            tag = "NEW " if (a, b) in fresh else ""
            for ref in edges[(a, b)]:
                print(f"    {tag}{name(a)} -> {name(b)}: {where(ref)}")
        if fresh:
            print(
                f"  NEW: {len(fresh)} edge(s) of this component lie on no listed cycle (a new import"
                " closed a cycle through them; the NEW back edges above are the likely new imports)"
                + (":" if args.verbose else "; -v lists them")
            )
            if args.verbose:
                for a, b in fresh:
                    cyc = cycle_through(succ, members, a, b)
                    print(f"    {name(a)} -> {name(b)}: {where(edges[(a, b)][0])}")
                    print(f"      on the cycle {' -> '.join(name(m) for m in cyc)}")
        if args.verbose:
            print("  every edge of the component:")
            for a, b in sorted((e for e in cycle_edges if e[0] in members), key=lambda e: (name(e[0]), name(e[1]))):
                for ref in edges[(a, b)]:
                    print(f"    {name(a)} -> {name(b)}: {where(ref)}")
    # Folders: within each folder, its sub-folders and files import one another in no circle.
    bad_folders = folder_cycles(nodes, edges)
    src_rel = os.path.relpath(src)

    def entry_name(folder, entry):
        under = folder + (entry,)
        is_dir = any(len(m) > len(under) and m[: len(under)] == under for m in nodes)
        return entry + "/" if is_dir else entry

    if not bad_folders:
        print("no import cycles between folders (within each folder, its sub-folders and files)")
    for folder, comp, cyc, inside in bad_folders:
        where_ = "/".join((src_rel,) + folder) + "/"
        print(f"\nfolder cycle in {where_}: {', '.join(entry_name(folder, e) for e in comp)}")
        print(f"  one cycle: {' -> '.join(entry_name(folder, e) for e in cyc)}")
        for a, b in zip(cyc, cyc[1:]):
            (fa, fb), refs = inside[(a, b)][0]
            print(f"    {entry_name(folder, a)} -> {entry_name(folder, b)}: {name(fa)} -> {name(fb)}: {where(refs[0])}")
        weight_ = {((a,), (b,)): sum(len(r) for _, r in fe) for (a, b), fe in inside.items()}
        back = back_edges([(e,) for e in comp], weight_)
        print("  back edges (the fewest references whose removal leaves these entries without a cycle):")
        for (a,), (b,) in back:
            for (fa, fb), refs in inside[(a, b)]:
                for ref in refs:
                    print(f"    {entry_name(folder, a)} -> {entry_name(folder, b)}: {name(fa)} -> {name(fb)}: {where(ref)}")
        if args.verbose:
            print("  every edge between these entries:")
            for (a, b), fe in sorted(inside.items()):
                for (fa, fb), refs in fe:
                    for ref in refs:
                        print(f"    {entry_name(folder, a)} -> {entry_name(folder, b)}: {name(fa)} -> {name(fb)}: {where(ref)}")
    for n, line in stale:
        print(
            f"{args.allow}:{n}: `{line}` is no longer a cycle: rewrite the file with --write-allow"
            " (the list only shrinks)",
            file=sys.stderr,
        )
    if args.allow:
        if new_edges:
            print(f"\nnew import cycles: {len(new_edges)} edge(s) on cycles the allow file does not list", file=sys.stderr)
        return 1 if new_edges or stale or bad_folders else 0
    return 1 if comps or bad_folders else 0


if __name__ == "__main__":
    sys.exit(main())

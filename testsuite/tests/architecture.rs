//! The module floors of `saga-runtime` (see `FLOORS`): its top-level
//! modules are layered, and a module may refer only to modules on lower
//! floors. The compiler accepts any `crate::` path between two modules of
//! one crate, so nothing else keeps the layers one-way: once one upward
//! reference is in, the next one looks as good, until every module depends
//! on every other and no part can be read, tested or replaced on its own.
//!
//! The parser is deliberately plain: comments (doc comments too), string
//! and char literals are blanked out, then every `crate::<name>` (and every
//! first name in a `crate::{a, b::c}` group) is a reference from the file's
//! top-level module to `<name>`'s. Unit tests inside `src/` count like any
//! other code. A name re-exported at the crate root (`crate::Error`,
//! `crate::task`, ...) counts as the module it comes from, read from
//! `lib.rs`'s `pub use` lines; a `#[macro_export]` macro as the module that
//! defines it. `lib.rs` itself is exempt: it wires the floors together.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The top-level modules of `saga-runtime/src`, lowest floor first. Data
/// flows down: the engine drives the workers, which run the state machines
/// (`saga`, `process`), which read and write through the `backend`, in the
/// records of `model`. A new module is placed here on purpose, on the floor
/// of the lowest module that may use it.
const FLOORS: &[&str] = &[
    "model",
    "util",
    "name",
    "policy",
    "context",
    "otel",
    "circuit",
    "limit",
    "backend",
    "error",
    "saga",
    "process",
    "transport",
    "metrics",
    "worker",
    "engine",
    "endpoint",
    "reconcile",
    "http",
    "testing",
];

/// Past this many lines a source file is doing too much to review (tests
/// excepted: a table of cases grows long without getting harder to read).
const MAX_LINES: usize = 800;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../saga-runtime/src")
}

/// One source file: its path relative to `src/`, its top-level module and
/// its text.
struct Source {
    path: String,
    module: String,
    text: String,
}

impl Source {
    fn is_test(&self) -> bool {
        self.path.ends_with("/tests.rs")
            || self.path == "tests.rs"
            || self.path.split('/').any(|part| part == "tests")
    }
}

/// Every `.rs` file under `src/` but `lib.rs`, in path order.
fn sources() -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("saga-runtime/src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = src_dir();
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let rel = path
                .strip_prefix(&root)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            if rel == "lib.rs" {
                return None;
            }
            let first = rel.split('/').next().expect("a first component");
            let module = first.strip_suffix(".rs").unwrap_or(first).to_owned();
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            Some(Source {
                path: rel,
                module,
                text,
            })
        })
        .collect()
}

/// The top-level modules as the file system has them: `x.rs` files and `x/`
/// folders directly under `src/` (but `lib.rs`).
fn top_level_modules() -> BTreeSet<String> {
    std::fs::read_dir(src_dir())
        .expect("saga-runtime/src is readable")
        .filter_map(|entry| {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name()?.to_str()?.to_owned();
            if path.is_dir() {
                Some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib").then(|| stem.to_owned())
            }
        })
        .collect()
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `src` with comments (doc comments included), string literals (raw and
/// byte ones too) and char literals replaced by spaces, line breaks kept so
/// that line numbers still hold. Lifetimes stay (`'a` is not a literal).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            // Block comments nest.
            let (mut depth, mut j) = (0, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some(end) = raw_string_end(b, i) {
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"'), or else a lifetime.
            let len = src[i + 1..].chars().next().map_or(0, char::len_utf8);
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 2 + n + 1)
            } else if b.get(i + 1 + len) == Some(&b'\'') {
                Some(i + 1 + len + 1)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("only whole literals and comments were blanked")
}

/// Where the raw string (`r"..."`, `r#"..."#`, `br"..."`) starting at `i`
/// ends, if one does.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && is_ident(b[i - 1]) {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = j + 1;
    let n = b[body..].windows(close.len()).position(|w| w == close)?;
    Some(body + n + close.len())
}

/// The identifier starting at `i`, if one does.
fn ident_at(code: &str, i: usize) -> Option<&str> {
    let len = code.as_bytes()[i..]
        .iter()
        .take_while(|&&c| is_ident(c))
        .count();
    (len > 0 && !code.as_bytes()[i].is_ascii_digit()).then(|| &code[i..i + len])
}

fn skip_space(code: &str, mut i: usize) -> usize {
    while code.as_bytes().get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// Every name a `crate::` path of `code` (already stripped) starts with, at
/// its byte offset: `crate::a::b` gives `a`, `crate::{a, b::c}` gives `a`
/// and `b` (`self` in a group names the crate root: nothing).
fn crate_paths(code: &str) -> Vec<(usize, &str)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("crate") {
        let at = from + n;
        from = at + "crate".len();
        let before_ok = at == 0 || !is_ident(b[at - 1]);
        let after_ok = b.get(from).is_none_or(|&c| !is_ident(c));
        let colons = skip_space(code, from);
        if !(before_ok && after_ok && code[colons..].starts_with("::")) {
            continue;
        }
        let next = skip_space(code, colons + 2);
        if b.get(next) == Some(&b'{') {
            // The first name of each element at the group's own depth.
            let (mut depth, mut j, mut element_start) = (1, next + 1, true);
            while j < b.len() && depth > 0 {
                match b[j] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    b',' if depth == 1 => element_start = true,
                    c if element_start && depth == 1 && is_ident(c) => {
                        let name = ident_at(code, j).unwrap_or("");
                        if !name.is_empty() && name != "self" {
                            found.push((j, name));
                        }
                        element_start = false;
                        j += name.len().max(1);
                        continue;
                    }
                    _ => {}
                }
                j += 1;
            }
        } else if let Some(name) = ident_at(code, next) {
            found.push((next, name));
        }
    }
    found
}

/// Where a name at the crate root comes from.
#[derive(Debug, Clone, PartialEq)]
enum Home {
    /// A top-level module of ours.
    Module(String),
    /// Another crate (the macros re-exported from `saga_macros`), or
    /// `lib.rs` itself (`prelude`, `__private`): no floor.
    Outside,
}

/// The names `lib.rs` and the `#[macro_export]` macros put at the crate
/// root, besides the modules: each `pub use <module>::..` leaf (an
/// identifier that ends a path, before `,`, `}` or `;`) counts as
/// `<module>`.
fn crate_root_names(sources: &[Source], modules: &BTreeSet<String>) -> BTreeMap<String, Home> {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).expect("lib.rs is readable");
    let lib = strip(&lib);
    let mut names = BTreeMap::new();
    let mut depth = 0usize;
    let b = lib.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        // The crate root's own items only, not those inside its inline
        // modules (`prelude`, `__private`: themselves on no floor).
        let starts_item = i == 0 || !is_ident(b[i - 1]);
        if depth == 0 && starts_item {
            if b[i..].starts_with(b"mod ") {
                let at = skip_space(&lib, i + 4);
                if let Some(name) = ident_at(&lib, at) {
                    let end = skip_space(&lib, at + name.len());
                    if b.get(end) == Some(&b'{') {
                        names.insert(name.to_owned(), Home::Outside);
                    }
                }
            } else if b[i..].starts_with(b"pub use ") {
                let end = i + lib[i..].find(';').expect("a use ends with ;");
                let statement = &lib[i + "pub use ".len()..=end];
                let root = ident_at(statement, skip_space(statement, 0)).unwrap_or("");
                let home = if modules.contains(root) {
                    Home::Module(root.to_owned())
                } else {
                    Home::Outside
                };
                for (at, _) in statement.match_indices(|c: char| ",};".contains(c)) {
                    let before = statement[..at].trim_end();
                    let start = before
                        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .map_or(0, |n| n + 1);
                    let leaf = &before[start..];
                    if !leaf.is_empty() && leaf != "self" {
                        names.insert(leaf.to_owned(), home.clone());
                    }
                }
                i = end;
            }
        }
        i += 1;
    }
    for source in sources {
        let code = strip(&source.text);
        for (at, _) in code.match_indices("macro_rules!") {
            let name_at = skip_space(&code, at + "macro_rules!".len());
            if let Some(name) = ident_at(&code, name_at) {
                names.insert(name.to_owned(), Home::Module(source.module.clone()));
            }
        }
    }
    names
}

/// A `crate::` path from one top-level module into another.
struct Reference {
    from: String,
    to: String,
    /// `file:line`.
    at: String,
    /// As written: `crate::engine`, `crate::Error` (error), ...
    text: String,
}

/// Every reference between two different top-level modules, and every
/// `crate::` name that none of the rules above places (as `file:line:
/// crate::name`).
fn references() -> (Vec<Reference>, Vec<String>) {
    let sources = sources();
    let modules = top_level_modules();
    let root_names = crate_root_names(&sources, &modules);
    let mut refs = Vec::new();
    let mut unplaced = Vec::new();
    for source in &sources {
        let code = strip(&source.text);
        for (offset, name) in crate_paths(&code) {
            let line = code[..offset].matches('\n').count() + 1;
            let at = format!("saga-runtime/src/{}:{line}", source.path);
            let to = if modules.contains(name) {
                name.to_owned()
            } else {
                match root_names.get(name) {
                    Some(Home::Module(module)) => module.clone(),
                    Some(Home::Outside) => continue,
                    None => {
                        unplaced.push(format!("{at}: crate::{name}"));
                        continue;
                    }
                }
            };
            if to == source.module {
                continue;
            }
            let text = if to == name {
                format!("crate::{name}")
            } else {
                format!("crate::{name} ({to})")
            };
            refs.push(Reference {
                from: source.module.clone(),
                to,
                at,
                text,
            });
        }
    }
    (refs, unplaced)
}

fn floor(module: &str) -> Option<usize> {
    FLOORS.iter().position(|m| *m == module)
}

#[test]
fn every_module_is_on_a_floor() {
    let found = top_level_modules();
    let listed: BTreeSet<String> = FLOORS.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(
        listed.len(),
        FLOORS.len(),
        "a module is listed twice in FLOORS"
    );
    let unplaced: Vec<_> = found.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        unplaced.is_empty() && gone.is_empty(),
        "the top-level modules of saga-runtime/src and FLOORS in tests/architecture.rs differ:\n\
         not on a floor (add each to FLOORS, above every module it uses): {unplaced:?}\n\
         listed but not in src/ (remove them from FLOORS): {gone:?}"
    );
}

#[test]
fn modules_refer_only_to_lower_floors() {
    let (refs, unplaced) = references();
    assert!(
        !refs.is_empty(),
        "no reference between modules found: the parser is broken"
    );
    let mut report = String::new();
    for r in &refs {
        // A module missing from FLOORS is `every_module_is_on_a_floor`'s
        // failure; here it sits on no floor and is skipped.
        let (Some(from), Some(to)) = (floor(&r.from), floor(&r.to)) else {
            continue;
        };
        if to > from {
            let _ = writeln!(
                report,
                "{}: {} (floor {}) refers to {} (floor {}): `{}`",
                r.at,
                r.from,
                from + 1,
                r.to,
                to + 1,
                r.text
            );
        }
    }
    for u in &unplaced {
        let _ = writeln!(
            report,
            "{u}: not a module, nor a name lib.rs re-exports, nor a macro: where does it live?"
        );
    }
    assert!(
        report.is_empty(),
        "saga-runtime modules may only refer to modules on lower floors \
         (FLOORS in tests/architecture.rs, lowest first):\n{report}"
    );
}

#[test]
fn no_circles_between_modules() {
    let (refs, _) = references();
    let mut edges = Edges::new();
    for r in &refs {
        edges.entry((&r.from, &r.to)).or_insert(r);
    }
    // Lowest floor first, so that a circle reads from the bottom up.
    let mut modules: Vec<&str> = edges.keys().flat_map(|&(a, b)| [a, b]).collect();
    modules.sort_by_key(|m| (floor(m).unwrap_or(usize::MAX), *m));
    modules.dedup();
    let reach: BTreeMap<&str, BTreeSet<&str>> =
        modules.iter().map(|&m| (m, reachable(&edges, m))).collect();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    let mut report = String::new();
    for &m in &modules {
        if reported.contains(m) || !reach[m].contains(m) {
            continue;
        }
        // Every module that m reaches and that reaches m back: one tangle,
        // reported once, with its shortest circle through m.
        let tangle: BTreeSet<&str> = reach[m]
            .iter()
            .copied()
            .filter(|other| reach[other].contains(m))
            .collect();
        reported.extend(&tangle);
        let path = shortest_circle(&edges, m).expect("m reaches itself");
        let _ = writeln!(
            report,
            "{} (modules in this tangle: {})",
            path.join(" -> "),
            tangle.into_iter().collect::<Vec<_>>().join(", ")
        );
        for hop in path.windows(2) {
            let r = edges[&(hop[0], hop[1])];
            let _ = writeln!(report, "    {}: `{}`", r.at, r.text);
        }
    }
    assert!(
        report.is_empty(),
        "saga-runtime modules refer to each other in a circle:\n{report}"
    );
}

/// One reference per edge between two modules (the first, to show where it
/// is).
type Edges<'a> = BTreeMap<(&'a str, &'a str), &'a Reference>;

/// The modules `start` refers to, directly or not.
fn reachable<'a>(edges: &Edges<'a>, start: &'a str) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for &(_, to) in edges.keys().filter(|(from, _)| *from == m) {
            if seen.insert(to) {
                queue.push_back(to);
            }
        }
    }
    seen
}

/// The shortest way along `edges` from `start` back to itself, if any.
fn shortest_circle<'a>(edges: &Edges<'a>, start: &'a str) -> Option<Vec<&'a str>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for &(_, to) in edges.keys().filter(|(from, _)| *from == m) {
            if to == start {
                let mut path = vec![start, m];
                let mut at = m;
                while at != start {
                    at = came_from[at];
                    path.push(at);
                }
                path.reverse();
                return Some(path);
            }
            if !came_from.contains_key(to) {
                came_from.insert(to, m);
                queue.push_back(to);
            }
        }
    }
    None
}

#[test]
fn no_source_file_is_too_long() {
    let mut long: Vec<(usize, String)> = sources()
        .into_iter()
        .filter(|s| !s.is_test())
        .map(|s| (s.text.lines().count(), s.path))
        .filter(|(lines, _)| *lines > MAX_LINES)
        .collect();
    long.sort_by(|a, b| b.cmp(a));
    let list: String = long
        .iter()
        .map(|(lines, path)| format!("    saga-runtime/src/{path}: {lines} lines\n"))
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them; tests.rs and tests/ excepted):\n{list}"
    );
}

/// The parser's corner cases, so that a change to it does not quietly stop
/// seeing references.
#[test]
fn the_parser_sees_code_only() {
    let code = strip(concat!(
        "use crate::{a, b::{c, d}, self};\n",
        "// crate::in_comment\n",
        "/// crate::in_doc\n",
        "/* crate::in /* nested */ block */ let s = \"crate::in_string \\\" crate::escaped\";\n",
        "let r = r#\"crate::in_raw \"# ; let c = '\"'; fn f<'a>(x: &'a str) { crate::e::f(x) }\n",
        "pub(crate) fn g() { $crate::h!(); mycrate::no(); crate\n    ::\n    i }\n",
    ));
    let names: Vec<_> = crate_paths(&code)
        .into_iter()
        .map(|(at, name)| (code[..at].matches('\n').count() + 1, name))
        .collect();
    assert_eq!(
        names,
        [(1, "a"), (1, "b"), (5, "e"), (6, "h"), (8, "i")],
        "in:\n{code}"
    );
}

#[test]
fn the_circle_finder_finds_circles() {
    let refs: Vec<Reference> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .into_iter()
        .map(|(from, to)| Reference {
            from: from.to_owned(),
            to: to.to_owned(),
            at: String::new(),
            text: String::new(),
        })
        .collect();
    let edges: Edges = refs
        .iter()
        .map(|r| ((r.from.as_str(), r.to.as_str()), r))
        .collect();
    assert_eq!(shortest_circle(&edges, "b"), Some(vec!["b", "c", "a", "b"]));
    assert_eq!(shortest_circle(&edges, "d"), None);
    assert_eq!(reachable(&edges, "a"), BTreeSet::from(["a", "b", "c", "d"]));
}

/// Every chapter of the guide is compiled by the doctests: a chapter left
/// out of `testsuite/src/lib.rs` would let its code blocks rot unseen.
#[test]
fn every_guide_chapter_is_a_doctest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = std::fs::read_to_string(root.join("testsuite/src/lib.rs")).expect("lib.rs");
    let mut chapters = 0;
    for entry in std::fs::read_dir(root.join("guide")).expect("guide/ is readable") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(".md") {
            continue;
        }
        chapters += 1;
        assert!(
            lib.contains(&format!("include_str!(\"../../guide/{name}\")")),
            "guide/{name} is not included as doctests in testsuite/src/lib.rs"
        );
    }
    assert!(chapters >= 9, "{chapters} chapters found");
    assert!(lib.contains("include_str!(\"../../README.md\")"));
}

//! The engine's module layering, read from its sources: no import circle, and the rule that
//! keeps it so. State modules own their data and locks and never import the filesystem façade
//! (`fs`) or an operation module; `fs` composes state modules only; operation modules
//! (`impl Fs` blocks: namei, file, xattr, inline, orphan, dir, the extent tree's operations,
//! writeback, ...) may use everything. A module neither list names counts as an operation
//! module: a new state module goes into `STATE` below. It also keeps the workspace's library
//! code in small pieces: no source file over 1,200 lines, no function over 150. The uext4
//! command (crates/uext4-cli) is held to no import circle among its modules and tools.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Modules that own state and import only other state modules.
const STATE: &[&str] = &[
    "bcache",
    "bigalloc",
    "block_validity",
    "blockdev",
    "crypto",
    "delalloc_state",
    "error",
    "extent_cache",
    "format",
    "geometry",
    "holder",
    "icache",
    "image",
    "journal",
    "mballoc",
    "mmp",
    "nbd",
    "partition",
    "super_info",
    "transaction",
];

/// The façade: imports state modules only.
const FACADE: &str = "fs";

/// The top-level module a source file belongs to (`journal/commit.rs` -> `journal`).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let m = first.strip_suffix(".rs").unwrap_or(first);
    (m != "lib").then(|| m.to_string())
}

/// The source without comments and without its unit tests (`#[cfg(test)] mod tests`, and
/// files named tests.rs): what the library itself is built from.
fn library_code(rel: &Path, src: &str) -> String {
    if rel.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    let mut out = String::with_capacity(src.len());
    let mut in_tests = false;
    let mut depth = 0i64;
    let mut pending_cfg_test = false;
    for line in src.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let t = code.trim();
        if in_tests {
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if depth <= 0 {
                in_tests = false;
            }
            continue;
        }
        if t == "#[cfg(test)]" {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test && t.starts_with("mod ") {
            pending_cfg_test = false;
            if t.ends_with(';') {
                continue;
            }
            depth = code.matches('{').count() as i64 - code.matches('}').count() as i64;
            in_tests = depth > 0;
            continue;
        }
        pending_cfg_test = false;
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The top-level modules a piece of code names through `crate::` (paths and `use` groups).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let b = code.as_bytes();
    let mut i = 0;
    while let Some(at) = code[i..].find("crate::") {
        let start = i + at;
        i = start + "crate::".len();
        // Not the tail of another path (`$crate::`, `my_crate::`).
        if start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
            continue;
        }
        if b.get(i) == Some(&b'{') {
            // `use crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item = String::new();
            let mut j = i;
            while j < b.len() {
                let c = b[j] as char;
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        push_first_segment(&item, &mut refs);
                        item.clear();
                        j += 1;
                        continue;
                    }
                    _ => {}
                }
                // Everything inside the outer braces but the opening brace itself.
                if depth > 1 || (depth == 1 && c != '{') {
                    item.push(c);
                }
                j += 1;
            }
            push_first_segment(&item, &mut refs);
            i = j;
        } else {
            let name: String = code[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            push_module(&name, &mut refs);
        }
    }
    refs
}

fn push_first_segment(item: &str, refs: &mut BTreeSet<String>) {
    let name: String = item
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    push_module(&name, refs);
}

/// Keeps lower-case names: modules (`crate::Error`, `crate::Result` are re-exports of the
/// crate root).
fn push_module(name: &str, refs: &mut BTreeSet<String>) {
    if name.starts_with(|c: char| c.is_ascii_lowercase()) && name != "self" {
        refs.insert(name.to_string());
    }
}

/// Module -> the modules it imports.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let Some(module) = module_of(rel) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap();
            let mut refs = crate_refs(&library_code(rel, &text));
            refs.remove(&module);
            graph.entry(module).or_default().extend(refs);
        }
    }
    graph
}

/// A circle through each group of modules that import one another, as "a -> b -> a".
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reaches = |from: &str, to: &str| -> Option<Vec<String>> {
        // Breadth-first: the shortest path from `from` to `to`.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from.to_string()]);
        while let Some(m) = queue.pop_front() {
            for n in graph.get(&m).into_iter().flatten() {
                if n == to {
                    let mut path = vec![to.to_string(), m.clone()];
                    let mut at = m.clone();
                    while let Some(p) = prev.get(&at) {
                        path.push(p.clone());
                        at = p.clone();
                    }
                    path.reverse();
                    return Some(path);
                }
                if n != from && !prev.contains_key(n) && graph.contains_key(n) {
                    prev.insert(n.clone(), m.clone());
                    queue.push_back(n.clone());
                }
            }
        }
        None
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if seen.contains(m) {
            continue;
        }
        if let Some(path) = reaches(m, m) {
            seen.extend(path.iter().cloned());
            out.push(path.join(" -> "));
        }
    }
    out
}

/// Imports that break the layering rule, as "a -> b (why)".
fn rule_breaks(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let is_state = |m: &str| STATE.contains(&m);
    let mut out = Vec::new();
    for (m, deps) in graph {
        for d in deps {
            if is_state(m) && !is_state(d) {
                out.push(format!(
                    "{m} -> {d} (a state module imports {})",
                    if d == FACADE {
                        "the façade"
                    } else {
                        "an operation module"
                    }
                ));
            } else if m == FACADE && !is_state(d) {
                out.push(format!(
                    "{m} -> {d} (the façade imports an operation module)"
                ));
            }
        }
    }
    out
}

#[test]
fn the_parser_reads_paths_and_use_groups() {
    let code = "use crate::error::{Error, Result};\nuse crate::{bcache::Buffer, fs::{Fs, X}};\n\
                let x = crate::journal::Journal::open(); crate::Error::Busy; my_crate::nope;";
    let refs: Vec<_> = crate_refs(code).into_iter().collect();
    assert_eq!(refs, ["bcache", "error", "fs", "journal"]);
    let src = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\nuse crate::c;\n";
    let refs: Vec<_> = crate_refs(&library_code(Path::new("x.rs"), src))
        .into_iter()
        .collect();
    assert_eq!(refs, ["a", "c"]);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    assert_eq!(circles(&g), ["a -> b -> c -> a"]);
}

#[test]
fn the_engine_has_no_import_circle_and_keeps_its_layers() {
    let graph = module_graph();
    let circles = circles(&graph);
    let breaks = rule_breaks(&graph);
    assert!(
        circles.is_empty() && breaks.is_empty(),
        "import circles:\n  {}\nimports against the layering rule:\n  {}",
        circles.join("\n  "),
        breaks.join("\n  ")
    );
}

/// Longest a source file may be, in lines of library code.
const MAX_FILE_LINES: usize = 1_200;
/// Longest a function may be, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 150;

/// `code` with string, char and comment contents blanked (kept the same length, line by
/// line), so braces inside them do not count.
fn blank_literals(code: &str) -> String {
    let b: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && b.get(i + 1) == Some(&'*') {
            i += 2;
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
            continue;
        }
        // Raw strings: r"..." and r#"..."#.
        if c == 'r'
            && (b.get(i + 1) == Some(&'"') || b.get(i + 1) == Some(&'#'))
            && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&'"') {
                j += 1;
                loop {
                    match b.get(j) {
                        None => break,
                        Some('"') if (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) => {
                            j += 1 + hashes;
                            break;
                        }
                        Some('\n') => out.push('\n'),
                        _ => {}
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        // A char literal ('x', '\n', '{'), not a lifetime ('a).
        if c == '\'' {
            let close = if b.get(i + 1) == Some(&'\\') {
                (i + 3..(i + 12).min(b.len())).find(|&k| b[k] == '\'')
            } else {
                (b.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            if let Some(k) = close {
                out.push_str("' '");
                i = k + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The functions of `code` longer than `max` lines, as (name, first line, lines).
fn long_functions(code: &str, max: usize) -> Vec<(String, usize, usize)> {
    let code = blank_literals(code);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else {
            continue;
        };
        if at > 0 {
            let before = line.as_bytes()[at - 1];
            if before.is_ascii_alphanumeric() || before == b'_' {
                continue;
            }
        }
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` before any `;` (a declaration in a trait has none).
        let mut depth = 0i64;
        let mut opened = false;
        let mut end = None;
        'scan: for (m, l) in lines.iter().enumerate().skip(n) {
            let from = if m == n { at } else { 0 };
            for ch in l[from..].chars() {
                match ch {
                    ';' if !opened => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = Some(m);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(m) = end {
            let len = m - n + 1;
            if len > max {
                out.push((name, n + 1, len));
            }
        }
    }
    out
}

/// Every `.rs` file under `dir`, but tests.rs files and `tests` folders.
fn library_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Files over the line limit and functions over theirs, outside tests, in the sources of
/// `crate_dir`.
fn size_breaks(crate_dir: &Path) -> Vec<String> {
    let src = crate_dir.join("src");
    let mut out = Vec::new();
    for path in library_files(&src) {
        let rel = path.strip_prefix(crate_dir.parent().unwrap()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        if text.starts_with("// Generated by") {
            // Tables a script writes (format/casefold/tables.rs) are data, not code to read.
            continue;
        }
        // Literals blanked first: a `//` inside a string is not a comment.
        let lib = library_code(path.strip_prefix(&src).unwrap(), &blank_literals(&text));
        let lines = lib.lines().count();
        if lines > MAX_FILE_LINES {
            out.push(format!(
                "{}: {lines} lines (at most {MAX_FILE_LINES})",
                rel.display()
            ));
        }
        for (name, at, len) in long_functions(&lib, MAX_FN_LINES) {
            out.push(format!(
                "{}: fn {name} (line {at} of the library code) is {len} lines (at most {MAX_FN_LINES})",
                rel.display()
            ));
        }
    }
    out
}

#[test]
fn the_size_scan_reads_functions_past_strings_and_comments() {
    let code = "fn a() {\n    let s = \"}}\"; // }\n    let c = '}';\n    /* } */\n    \
                let r = r#\"{\"#;\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    v\n}\n\
                trait T {\n    fn c(&self);\n}\n";
    let all = long_functions(code, 0);
    let names: Vec<_> = all
        .iter()
        .map(|(n, at, len)| (n.as_str(), *at, *len))
        .collect();
    assert_eq!(names, [("a", 1, 6), ("b", 7, 3)]);
    // On a real file: every function found, the longest ones measured whole.
    let rel = Path::new("namei/rename.rs");
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(rel))
        .unwrap();
    let found = long_functions(&library_code(rel, &blank_literals(&text)), 0);
    let len = |name: &str| found.iter().find(|f| f.0 == name).map(|f| f.2);
    assert!(found.len() >= 10, "{found:?}");
    assert!(
        len("rename_inner").is_some_and(|n| (50..=150).contains(&n)),
        "{found:?}"
    );
}

/// The workspace's library code keeps small files and functions: at most 1,200 lines a file
/// and 150 lines a function, outside tests.
#[test]
fn no_source_file_or_function_is_too_long() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crates = engine.parent().unwrap();
    let mut breaks = Vec::new();
    for name in ["uext4", "uext4-fuse", "uext4-cli", "uext4-bench"] {
        // The engine alone (a packaged crate) has no neighbours to check.
        if crates.join(name).join("src").is_dir() {
            breaks.extend(size_breaks(&crates.join(name)));
        }
    }
    assert!(breaks.is_empty(), "too long:\n  {}", breaks.join("\n  "));
}

/// The command's modules: the top-level ones of crates/uext4-cli/src, and each tool
/// (`tools/cp/...` -> `tools::cp`) on its own; tools/mod.rs, the dispatcher that names every
/// tool, is left out. Each maps to the units it names through `crate::` or `crate::tools::`,
/// and, in a tool's own file, through `super::` (its siblings).
fn cli_module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let tools: BTreeSet<String> = std::fs::read_dir(src.join("tools"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let unit = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            (unit != "mod").then_some(unit)
        })
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in library_files(src) {
        let rel = path.strip_prefix(src).unwrap();
        let parts: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        let unit = match parts.as_slice() {
            ["tools", "mod.rs"] => continue,
            ["tools", tool, ..] => format!("tools::{}", tool.strip_suffix(".rs").unwrap_or(tool)),
            _ => match module_of(rel) {
                Some(m) if m != "main" => m,
                _ => continue,
            },
        };
        let code = library_code(rel, &std::fs::read_to_string(&path).unwrap());
        // `crate::tools::x` and a tool's `super::x` both name tool x: rewritten to a name
        // crate_refs reads as a top-level module, marked so it is told from one.
        let mut code = code.replace("crate::tools::", "crate::tool__");
        if parts.len() == 2 && parts[0] == "tools" {
            code = code.replace("super::", "crate::tool__");
        }
        let refs = crate_refs(&code)
            .into_iter()
            .filter_map(|r| match r.strip_prefix("tool__") {
                Some(t) => tools.contains(t).then(|| format!("tools::{t}")),
                None => (r != "tools").then_some(r),
            });
        let to = graph.entry(unit.clone()).or_default();
        to.extend(refs);
        to.remove(&unit);
    }
    graph
}

/// The uext4 command has no import circle either: its tools use the build pipeline and the
/// image helpers one way.
#[test]
fn the_command_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../uext4-cli/src");
    if !src.is_dir() {
        return; // The engine alone (a packaged crate) has no neighbours to check.
    }
    let graph = cli_module_graph(&src);
    assert!(
        graph.len() > 10 && graph.contains_key("tools::cp"),
        "{graph:?}"
    );
    let circles = circles(&graph);
    assert!(
        circles.is_empty(),
        "import circles in the uext4 command:\n  {}",
        circles.join("\n  ")
    );
}

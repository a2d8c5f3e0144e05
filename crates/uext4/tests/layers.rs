//! The engine's module layering, read from its sources: no import circle, and the rule that
//! keeps it so. State modules own their data and locks and never import the filesystem façade
//! (`fs`) or an operation module; `fs` composes state modules only; operation modules
//! (`impl Fs` blocks: namei, file, xattr, inline, orphan, dir, the extent tree's operations,
//! writeback, ...) may use everything. A module neither list names counts as an operation
//! module: a new state module goes into `STATE` below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Modules that own state and import only other state modules.
const STATE: &[&str] = &[
    "bcache",
    "block_validity",
    "blockdev",
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

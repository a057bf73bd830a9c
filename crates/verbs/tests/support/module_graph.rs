//! The module-graph checks that crates share (verbs' and store's
//! `tests/module_graph.rs` include this file): the graph of a crate's
//! top-level modules from its `crate::` references, its cycles, and the
//! file-size ratchet.
//!
//! A module depends on another when its source names `crate::other` (in a
//! path or a `use crate::{other, ...}` group); the files of a directory
//! (`iwarp/*.rs`) count as one module. Comments are ignored.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`iwarp/rx.rs` -> `iwarp`).
pub fn module_of(rel: &Path) -> String {
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The module names a source text refers to through `crate::`.
pub fn references(text: &str) -> BTreeSet<String> {
    references_through(text, "crate::")
}

/// The names a source text refers to through `prefix` (`crate::`, or
/// `super::` for the files of one directory): `prefix name`, and each name
/// of a `use prefix{...}` group, on one line or one per line.
pub fn references_through(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let after = &rest[i + prefix.len()..];
            if let Some(group) = after.strip_prefix('{') {
                // use crate::{a, b::c, ...} (one line; rustfmt splits long
                // groups one item per line, handled below).
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item.trim().chars().take_while(|&c| is_ident(c)).collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
            } else {
                let name: String = after.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
            rest = after;
        }
    }
    // Multi-line groups: `use crate::{` ... `};`
    let mut in_group = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap().trim();
        if code.starts_with(&format!("use {prefix}{{")) && !code.contains('}') {
            in_group = true;
            continue;
        }
        if in_group {
            if code.starts_with('}') {
                in_group = false;
                continue;
            }
            let name: String = code.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The graph of the top-level modules of the crate whose sources are in
/// `src`: each with the modules it refers to through `crate::`.
pub fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(f.strip_prefix(src).unwrap());
        if m == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        g.entry(m).or_default().extend(references(&text));
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for (m, deps) in g.iter_mut() {
        deps.retain(|d| names.contains(d) && d != m);
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
pub fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

pub fn render(g: &BTreeMap<String, BTreeSet<String>>) -> String {
    g.iter()
        .map(|(m, d)| {
            format!(
                "  {m} -> {}",
                d.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The file-size ratchet: files in `src` over `max` lines that `caps` does
/// not list (or that outgrew their cap), and files `caps` lists that are
/// now within `max` (drop them from the list).
pub fn oversize(src: &Path, caps: &[(&str, usize)], max: usize) -> (Vec<String>, Vec<String>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let caps: BTreeMap<&str, usize> = caps.iter().copied().collect();
    let mut bad = Vec::new();
    let mut loose = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap().to_string_lossy().to_string();
        let lines = std::fs::read_to_string(f).unwrap().lines().count();
        match caps.get(rel.as_str()) {
            Some(&cap) if lines > cap => bad.push(format!("{rel}: {lines} lines (cap {cap})")),
            Some(_) if lines <= max => loose.push(format!("{rel}: {lines} lines")),
            Some(_) => {}
            None if lines > max => bad.push(format!("{rel}: {lines} lines (max {max})")),
            None => {}
        }
    }
    (bad, loose)
}

/// Fails, printing `graph`, when it has a cycle; `what` says what its
/// nodes are ("the modules of crates/verbs").
pub fn assert_no_cycle(graph: &BTreeMap<String, BTreeSet<String>>, what: &str) {
    let found = cycles(graph);
    assert!(
        found.is_empty(),
        "import cycles among {what}: {found:?}\n{}",
        render(graph)
    );
}

/// The file-size ratchet as a check ([`oversize`]): fails when a file in
/// `dir` is over `max` lines and not in `oversize_list` (or outgrew its
/// cap there), or when a file the list names is now within `max` (it must
/// leave the list).
pub fn assert_small(dir: &Path, oversize_list: &[(&str, usize)], max: usize) {
    let (bad, loose) = oversize(dir, oversize_list, max);
    assert!(bad.is_empty(), "source files too long: {bad:?}");
    assert!(
        loose.is_empty(),
        "now within {max} lines: drop them from OVERSIZE: {loose:?}"
    );
}

/// The graph of the files of one module's directory (`src/iwarp`), each
/// with the sibling files it names through `super::` or
/// `crate::<module>::`. `mod.rs` is left out (it declares them all), and so
/// are glob imports (`use super::*`), which hide an edge through what
/// `mod.rs` re-exports. A subdirectory (`src/net/redis_door/`) is one
/// node: what its files name through `crate::<module>::`, and its own
/// `mod.rs` through `super::`.
pub fn dir_graph(dir: &Path, module: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            let mut files = Vec::new();
            rust_files(&p, &mut files);
            let refs = g.entry(name).or_default();
            for f in &files {
                let text = std::fs::read_to_string(f).unwrap();
                refs.extend(references_through(&text, &format!("crate::{module}::")));
                if *f == p.join("mod.rs") {
                    refs.extend(references_through(&text, "super::"));
                }
            }
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") || name == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let mut refs = references_through(&text, "super::");
        refs.extend(references_through(&text, &format!("crate::{module}::")));
        g.entry(name).or_default().extend(refs);
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for (m, deps) in g.iter_mut() {
        deps.retain(|d| names.contains(d) && d != m);
    }
    g
}

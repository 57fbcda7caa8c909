//! The BTL's files stand on floors, and a file imports only from its own
//! floor or below, never in a circle. This reads every `crate::` path in
//! btl/src outside comments (`use` lines and inline paths alike) and checks
//! it against [`FLOORS`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module of btl/src (a file, or `proto` for the directory) and its
/// floor, lowest first. `lib.rs`, the root, is above them all.
const FLOORS: &[(&str, u8)] = &[
    // 1: the vocabulary.
    ("types", 1),
    ("callbacks", 1),
    ("config", 1),
    ("wire", 1),
    ("wr_id", 1),
    ("credits", 1),
    ("place", 1),
    ("addr", 1),
    // 2: the protocols without I/O, the device's resources, deliveries,
    // registrations, the nodes' XRC domains.
    ("proto", 2),
    ("iface", 2),
    ("delivery", 2),
    ("regs", 2),
    ("domains", 2),
    // 3: work, pools, connections.
    ("work", 3),
    ("pools", 3),
    ("conn", 3),
    // 4: endpoints.
    ("ep", 4),
    // 5: posting and receiving.
    ("post", 5),
    ("recv", 5),
    // 6: the state behind the lock.
    ("core", 6),
    // 7: the API.
    ("btl", 7),
    // 8: what runs a BTL.
    ("threaded", 8),
    ("sim", 8),
];

/// `text` without its comments (line, block and doc comments) and string
/// literals, so that a path in prose or in a message is not an import.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\n'): skipped whole, so that its quote
            // does not open a string. Lifetimes ('a) are left alone.
            let end = b[i + 1..]
                .iter()
                .position(|&c| c == b'\'')
                .map_or(b.len(), |p| i + 2 + p);
            i = end;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The names a piece of code reaches through `crate::` or `super::`:
/// `crate::x::...`, each top-level name of `crate::{x::..., y, ...}`, and
/// the same after any chain of `super::`. A name reached through `super::`
/// is an item of the file's own module unless it is a module of
/// [`FLOORS`] (the caller keeps only those).
fn crate_paths(code: &str) -> BTreeSet<String> {
    paths(code).into_iter().map(|(name, _)| name).collect()
}

/// [`crate_paths`], each name with whether it was reached through
/// `super::`.
fn paths(code: &str) -> BTreeSet<(String, bool)> {
    let mut found = BTreeSet::new();
    let starts = code
        .match_indices("crate::")
        .map(|(at, m)| (at + m.len(), false))
        .chain(
            code.match_indices("super::")
                .filter(|(at, _)| !code[..*at].ends_with("super::"))
                .map(|(at, _)| {
                    let mut end = at;
                    while code[end..].starts_with("super::") {
                        end += "super::".len();
                    }
                    (end, true)
                }),
        );
    for (at, via_super) in starts {
        let rest = code[at..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        found.insert((ident(&group[k..]).to_string(), via_super));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert((ident(rest).to_string(), via_super));
        }
    }
    found
}

/// Every module's imports of other modules: (from, to) with both in
/// [`FLOORS`]. A name that is not a module (`crate::Btl`, a re-export of
/// lib.rs) must be added to FLOORS' modules or imported by its path.
fn imports() -> BTreeSet<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                files.push((
                    p.file_name().unwrap().to_str().unwrap().to_string(),
                    e.unwrap().path(),
                ));
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push((p.file_stem().unwrap().to_str().unwrap().to_string(), p));
        }
    }
    let known: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
    let mut edges = BTreeSet::new();
    for (module, path) in files {
        if module == "lib" {
            continue;
        }
        assert!(
            known.contains_key(module.as_str()),
            "btl/src/{module} has no floor in FLOORS"
        );
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        for (to, via_super) in paths(&code) {
            if via_super && !known.contains_key(to.as_str()) {
                // An item of the file's own module (`super::Core`).
                continue;
            }
            assert!(
                known.contains_key(to.as_str()),
                "{}: crate::{to} is not a module of FLOORS (import it by its module's path)",
                path.display()
            );
            if to != module {
                edges.insert((module.clone(), to));
            }
        }
    }
    edges
}

/// Whether `to` reaches `from` through `edges`.
fn reaches(edges: &BTreeSet<(String, String)>, to: &str, from: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![to.to_string()];
    while let Some(m) = stack.pop() {
        if m == from {
            return true;
        }
        if seen.insert(m.clone()) {
            stack.extend(
                edges
                    .iter()
                    .filter(|(a, _)| *a == m)
                    .map(|(_, b)| b.clone()),
            );
        }
    }
    false
}

/// The imports of `edges` that break the floors: up a floor, or within
/// one floor in a circle.
fn wrong_way(edges: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
    let floor: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
    let same_floor: BTreeSet<(String, String)> = edges
        .iter()
        .filter(|(a, b)| floor[a.as_str()] == floor[b.as_str()])
        .cloned()
        .collect();
    edges
        .iter()
        .filter(|(a, b)| {
            floor[a.as_str()] < floor[b.as_str()]
                || (floor[a.as_str()] == floor[b.as_str()] && reaches(&same_floor, b, a))
        })
        .cloned()
        .collect()
}

#[test]
fn every_import_stays_on_its_floor_or_goes_down() {
    let wrong = wrong_way(&imports());
    assert!(
        wrong.is_empty(),
        "imports that run up a floor or close a circle: {wrong:?}"
    );
}

#[test]
fn the_check_sees_grouped_inline_and_commented_paths() {
    let code = code_only(
        "use crate::{config::X, core::{A, B}};\n// crate::btl in prose\n\
         let m = crate::wire::MAX; /* crate::sim */ let s = \"crate::ep\"; let c = '\"';\n\
         let t = crate::types::Tag(1);\n\
         use super::{Core, MAX_TRIES}; use super::super::btl::Btl;",
    );
    let got: Vec<String> = crate_paths(&code).into_iter().collect();
    assert_eq!(
        got,
        [
            "Core",
            "MAX_TRIES",
            "btl",
            "config",
            "core",
            "types",
            "wire"
        ]
    );
}

#[test]
fn an_import_up_a_floor_or_in_a_circle_is_wrong() {
    let e = |v: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    // Down a floor, and one way within a floor: fine.
    assert!(wrong_way(&e(&[("core", "ep"), ("config", "wire"), ("wire", "place")])).is_empty());
    // Up a floor.
    assert_eq!(
        wrong_way(&e(&[("config", "core")])),
        e(&[("config", "core")])
    );
    // A circle within a floor: both of its imports.
    assert_eq!(
        wrong_way(&e(&[("config", "wire"), ("wire", "config")])),
        e(&[("config", "wire"), ("wire", "config")])
    );
}

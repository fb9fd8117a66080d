//! The server's layering, checked: every `crate::` path in `server/src` (in `use` trees,
//! types, expressions and macro bodies, test modules included) and every `super::` path that
//! leaves its top-level part is resolved to the part it names, and a part may name only the
//! parts below it. The order is the one `server/src/lib.rs` documents (# Layers); a part
//! naming one above it, or a sibling of its own layer, fails the test with the file, line
//! and path. Since the layers are a total order with no sibling edges, no cycle can form.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit_mut::VisitMut;

/// Top to bottom: a part may use the parts of any later layer, never of its own or an
/// earlier one (besides itself). Keep in step with the list in `server/src/lib.rs`.
const LAYERS: &[&[&str]] = &[
    &["server"],
    &["config"],
    &["rpc", "handoff"],
    &["views"],
    &["coord"],
    &["cluster", "snapshot", "tuner"],
    &["artifacts"],
    &["store"],
    &["journal"],
    &["wire", "ops"],
    &["error"],
    &["model"],
    &["report", "tasks", "sync"],
];

/// Imports allowed against the order, each with its reason: (from part, to part, reason).
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

fn layer_of(part: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&part))
}

/// One path that names a part of the crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    file: PathBuf,
    line: usize,
    from: String,
    to: String,
    path: String,
}

/// The module path of `file` under `src` (`store/scan.rs` is `["store", "scan"]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// Collects the parts a file's paths name. (syn keeps no line numbers without
/// proc-macro2's `span-locations`, which would rebuild every proc-macro crate of the
/// workspace; the report finds the line in the text instead, `line_of`.)
struct Collector<'f> {
    file: &'f Path,
    text: &'f str,
    module: Vec<String>,
    found: Vec<Import>,
}

impl Collector<'_> {
    /// The first line of the file that names `to` as a path segment (`to::`), 1-based.
    fn line_of(&self, to: &str) -> usize {
        let needle = format!("{to}::");
        self.text
            .lines()
            .position(|line| {
                line.match_indices(&needle).any(|(at, _)| {
                    at == 0
                        || !line.as_bytes()[at - 1].is_ascii_alphanumeric()
                            && line.as_bytes()[at - 1] != b'_'
                })
            })
            .map_or(0, |i| i + 1)
    }

    /// `segments` as written (`crate`, `super`, names): records the part it reaches, if it
    /// leaves the file's own top-level part.
    fn record(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let target = match first.as_str() {
            "crate" => segments.get(1).cloned(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                if ups < self.module.len() {
                    // Still inside this file's top-level part.
                    return;
                }
                segments.get(ups).cloned()
            }
            _ => return,
        };
        let (Some(target), Some(from)) = (target, self.module.first().cloned()) else {
            return;
        };
        if layer_of(&target).is_none() || target == from {
            return; // a re-export at the root (`crate::Config`), or the part itself
        }
        let line = self.line_of(&target);
        self.found.push(Import {
            file: self.file.to_owned(),
            line,
            from,
            to: target,
            path: segments.join("::"),
        });
    }

    /// Paths inside macro bodies, which syn leaves as tokens: `crate :: x` and
    /// `super :: ... :: x` sequences.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.scan_tokens(group.stream()),
                TokenTree::Ident(ident) if ident == "crate" || ident == "super" => {
                    let mut segments = vec![ident.to_string()];
                    let mut j = i + 1;
                    while j + 2 < trees.len() + 1 {
                        let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                            (trees.get(j), trees.get(j + 1))
                        else {
                            break;
                        };
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        let Some(TokenTree::Ident(next)) = trees.get(j + 2) else {
                            break;
                        };
                        segments.push(next.to_string());
                        j += 3;
                    }
                    self.record(&segments);
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl VisitMut for Collector<'_> {
    fn visit_item_use_mut(&mut self, item: &mut syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path_mut(&mut self, path: &mut syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments);
        syn::visit_mut::visit_path_mut(self, path);
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        self.scan_tokens(mac.tokens.clone());
        syn::visit_mut::visit_macro_mut(self, mac);
    }

    fn visit_item_mod_mut(&mut self, item: &mut syn::ItemMod) {
        // An inline module (`mod tests { .. }`) is one level deeper for `super::`.
        if item.content.is_some() {
            self.module.push(item.ident.to_string());
            syn::visit_mut::visit_item_mod_mut(self, item);
            self.module.pop();
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every path of `src`'s files that names another part of the crate.
fn imports(src: &Path) -> Vec<Import> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        if file
            .file_name()
            .is_some_and(|n| n == "main.rs" || n == "lib.rs")
        {
            continue; // the binary, and the root that declares the parts
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let mut parsed = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut collector = Collector {
            file: &file,
            text: &text,
            module: module_of(src, &file),
            found: Vec::new(),
        };
        collector.visit_file_mut(&mut parsed);
        found.extend(collector.found);
    }
    found
}

/// The imports that break the order (up, or across one layer), less the listed exceptions.
fn violations(found: &[Import]) -> Vec<&Import> {
    found
        .iter()
        .filter(|import| {
            let (Some(from), Some(to)) = (layer_of(&import.from), layer_of(&import.to)) else {
                return false;
            };
            to <= from
                && !EXCEPTIONS
                    .iter()
                    .any(|(f, t, _)| *f == import.from && *t == import.to)
        })
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_part_of_the_server_is_in_one_layer() {
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(src()).expect("read src") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name != "main" && name != "lib" {
            parts.push(name);
        }
    }
    let missing: Vec<&String> = parts.iter().filter(|p| layer_of(p).is_none()).collect();
    assert!(
        missing.is_empty(),
        "parts with no layer (add them to LAYERS here and to server/src/lib.rs): {missing:?}"
    );
}

#[test]
fn no_part_imports_one_above_it_or_beside_it() {
    let found = imports(&src());
    assert!(
        found.len() > 100,
        "the collector found only {} imports: it is not reading the sources",
        found.len()
    );
    let bad = violations(&found);
    let mut by_edge: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for import in &bad {
        let at = format!(
            "{}:{} {}",
            import
                .file
                .strip_prefix(src())
                .unwrap_or(&import.file)
                .display(),
            import.line,
            import.path
        );
        by_edge
            .entry((import.from.clone(), import.to.clone()))
            .or_default()
            .push(at);
    }
    let report: Vec<String> = by_edge
        .iter()
        .map(|((from, to), at)| format!("{from} -> {to}:\n    {}", at.join("\n    ")))
        .collect();
    assert!(
        bad.is_empty(),
        "{} imports against the layers (server/src/lib.rs, # Layers):\n{}",
        bad.len(),
        report.join("\n")
    );
}

#[test]
fn the_collector_sees_uses_paths_and_macro_bodies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    std::fs::write(
        store.join("mod.rs"),
        r#"
use crate::views::Plan;
use crate::{model::entry::CacheKey, rpc::stats};
fn f() { let _ = crate::coord::MAX_WAIT; tracing::info!("{}", crate::cluster::X); }
mod tests { use super::super::server::run; use super::Thing; }
impl crate::report::FillStats for Store {}
"#,
    )
    .expect("write");
    let found = imports(dir.path());
    let edges: Vec<(&str, &str, usize)> = found
        .iter()
        .map(|i| (i.from.as_str(), i.to.as_str(), i.line))
        .collect();
    assert_eq!(
        edges,
        vec![
            ("store", "views", 2),
            ("store", "model", 3),
            ("store", "rpc", 3),
            ("store", "coord", 4),
            ("store", "cluster", 4),
            ("store", "server", 5),
            ("store", "report", 6),
        ]
    );
    let bad: Vec<&str> = violations(&found).iter().map(|i| i.to.as_str()).collect();
    assert_eq!(bad, vec!["views", "rpc", "coord", "cluster", "server"]);
}

//! The server's layering, checked: every `crate::` path in `server/src` (in `use` trees,
//! types, expressions and macro bodies, test modules included) and every `super::` path that
//! leaves its top-level part is resolved to the part it names, and a part may name only the
//! parts below it. The order is the one `server/src/lib.rs` documents (# Layers); a part
//! naming one above it, or a sibling of its own layer, fails the test with the file, line
//! and path. Since the layers are a total order with no sibling edges, no cycle can form.
//!
//! Inside a part, the modules of each directory (`server/src/<part>/`, and every directory
//! module below it) are checked for import loops: a path from one module to a sibling,
//! directly or through their parent's re-export, is an edge, and a cycle of edges fails the
//! test naming the modules and the paths that close it (`KNOWN_LOOPS` lists those left).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit_mut::VisitMut;

mod source_tree;
use source_tree::rust_files;

/// Top to bottom: a part may use the parts of any later layer, never of its own or an
/// earlier one (besides itself). Keep in step with the list in `server/src/lib.rs`.
const LAYERS: &[&[&str]] = &[
    &["server"],
    &["config"],
    &["rpc", "handoff"],
    &["views"],
    &["coord"],
    &["bundles", "cluster", "snapshot", "tuner"],
    &["artifacts"],
    &["tiers"],
    &["store"],
    &["journal"],
    &["wire", "ops"],
    &["error"],
    &["model"],
    &["report", "tasks", "sync", "fsx"],
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
    /// Every `crate::`, `super::` and `self::` path as written, with the module (inline
    /// modules included) it is written in: the input of the check inside a part.
    written: Vec<(Vec<String>, Vec<String>)>,
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
        if matches!(first.as_str(), "crate" | "super" | "self") {
            self.written.push((segments.to_vec(), self.module.clone()));
        }
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
                TokenTree::Ident(ident)
                    if ident == "crate" || ident == "super" || ident == "self" =>
                {
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

/// One source file of `src`, read: the cross-part paths it names, every crate-relative path
/// it writes, and its top-level `use` items (what a module root re-exports).
struct Source {
    file: PathBuf,
    module: Vec<String>,
    found: Vec<Import>,
    written: Vec<(Vec<String>, Vec<String>)>,
    uses: Vec<syn::ItemUse>,
}

/// Every source file of `src` but the binary and the crate root, parsed.
fn sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
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
        let module = module_of(src, &file);
        let mut collector = Collector {
            file: &file,
            text: &text,
            module: module.clone(),
            found: Vec::new(),
            written: Vec::new(),
        };
        collector.visit_file_mut(&mut parsed);
        let (found, written) = (collector.found, collector.written);
        let uses = parsed
            .items
            .into_iter()
            .filter_map(|item| match item {
                syn::Item::Use(item) => Some(item),
                _ => None,
            })
            .collect();
        out.push(Source {
            file,
            module,
            found,
            written,
            uses,
        });
    }
    out
}

/// Every path of `src`'s files that names another part of the crate.
fn imports(src: &Path) -> Vec<Import> {
    sources(src)
        .into_iter()
        .flat_map(|source| source.found)
        .collect()
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

// Inside a part: the modules of one directory (a part, or a directory module in it) must
// not import each other in a loop. A loop there means neither module owns what they share;
// the shared item belongs in one of them, or in a small module both use.

/// Loops left for now, each with its reason: (directory, its modules in the loop, sorted,
/// reason). The test fails on any other loop, and on a listed one that is gone (take it off
/// the list).
const KNOWN_LOOPS: &[(&str, &[&str], &str)] = &[];

/// `segments` (as written in a module at `at`, inline modules included) as a path from the
/// crate root, or `None` for a path that does not start at `crate`, `super` or `self`.
fn absolute(segments: &[String], at: &[String]) -> Option<Vec<String>> {
    let mut path: Vec<String> = match segments.first()?.as_str() {
        "crate" => segments[1..].to_vec(),
        "self" => at.iter().chain(&segments[1..]).cloned().collect(),
        "super" => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let kept = at.len().checked_sub(ups)?;
            at[..kept].iter().chain(&segments[ups..]).cloned().collect()
        }
        _ => return None,
    };
    // `use super::{self, x}` names the module itself.
    path.retain(|segment| segment != "self");
    Some(path)
}

/// What module roots re-export: (module, name) to the path the name stands for, from
/// crate root. A child module reaches a sibling through its parent's `use` as surely as
/// by naming the sibling.
type Reexports = BTreeMap<(Vec<String>, String), Vec<String>>;

fn reexports(sources: &[Source], modules: &[Vec<String>]) -> Reexports {
    fn walk(
        tree: &syn::UseTree,
        prefix: &mut Vec<String>,
        module: &[String],
        modules: &[Vec<String>],
        out: &mut Reexports,
    ) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                walk(&path.tree, prefix, module, modules, out);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let ident = name.ident.to_string();
                let alias = if ident == "self" {
                    prefix.last().cloned()
                } else {
                    Some(ident.clone())
                };
                prefix.push(ident);
                record(prefix, alias, module, modules, out);
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                record(
                    prefix,
                    Some(rename.rename.to_string()),
                    module,
                    modules,
                    out,
                );
                prefix.pop();
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    walk(tree, prefix, module, modules, out);
                }
            }
        }
    }
    fn record(
        written: &[String],
        alias: Option<String>,
        module: &[String],
        modules: &[Vec<String>],
        out: &mut Reexports,
    ) {
        let Some(alias) = alias else { return };
        let target = absolute(written, module).or_else(|| {
            // A path from one of the module's own children (`use keys::Key`).
            let mut child = module.to_vec();
            child.push(written.first()?.clone());
            modules.contains(&child).then(|| {
                module
                    .iter()
                    .chain(written)
                    .filter(|s| *s != "self")
                    .cloned()
                    .collect()
            })
        });
        if let Some(target) = target {
            out.insert((module.to_vec(), alias), target);
        }
    }
    let mut out = Reexports::new();
    for source in sources {
        for item in &source.uses {
            walk(
                &item.tree,
                &mut Vec::new(),
                &source.module,
                modules,
                &mut out,
            );
        }
    }
    out
}

/// `path` with every step through a module root's re-export replaced by what it re-exports.
fn resolve(mut path: Vec<String>, modules: &[Vec<String>], reexports: &Reexports) -> Vec<String> {
    for _ in 0..16 {
        let step = (1..path.len()).find_map(|k| {
            let module = &path[..k];
            let mut child = module.to_vec();
            child.push(path[k].clone());
            if !modules.contains(&module.to_vec()) || modules.contains(&child) {
                return None;
            }
            let target = reexports.get(&(module.to_vec(), path[k].clone()))?;
            let rest = &path[k + 1..];
            Some(target.iter().chain(rest).cloned().collect::<Vec<_>>())
        });
        match step {
            Some(next) if next != path => path = next,
            _ => break,
        }
    }
    path
}

/// One module naming a sibling: in directory `dir`, child `from` names child `to`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SiblingUse {
    dir: Vec<String>,
    from: String,
    to: String,
    file: PathBuf,
    path: String,
}

/// Every path inside a part from one module of a directory to a sibling of it (modules in
/// `server/src/<part>/`, and in each directory module below).
fn sibling_uses(src: &Path) -> Vec<SiblingUse> {
    let sources = sources(src);
    let modules: Vec<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let reexports = reexports(&sources, &modules);
    let mut found = Vec::new();
    for source in &sources {
        for (written, at) in &source.written {
            let Some(path) = absolute(written, at) else {
                continue;
            };
            let path = resolve(path, &modules, &reexports);
            if path.first() != source.module.first() {
                continue; // another part: the layers test's business
            }
            // The directory both live in: the longest common prefix, below the part root.
            let common = path
                .iter()
                .zip(&source.module)
                .take_while(|(a, b)| a == b)
                .count();
            if common == 0 || common >= source.module.len() || common >= path.len() {
                continue; // the module itself, its own children, or its ancestors' items
            }
            let dir = source.module[..common].to_vec();
            let mut to_module = dir.clone();
            to_module.push(path[common].clone());
            if !modules.contains(&to_module) {
                continue; // an item of the directory's root, not a sibling module
            }
            found.push(SiblingUse {
                dir,
                from: source.module[common].clone(),
                to: path[common].clone(),
                file: source.file.clone(),
                path: written.join("::"),
            });
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The loops among siblings: each strongly connected set of more than one module of one
/// directory, as (directory, modules), found by Tarjan's algorithm.
fn sibling_loops(uses: &[SiblingUse]) -> Vec<(Vec<String>, Vec<String>)> {
    let mut by_dir: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for edge in uses {
        let graph = by_dir.entry(edge.dir.clone()).or_default();
        let next = graph.entry(edge.from.clone()).or_default();
        if !next.contains(&edge.to) {
            next.push(edge.to.clone());
        }
        graph.entry(edge.to.clone()).or_default();
    }
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, Vec<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        components: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, node: &'g str) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            for next in &self.graph[node] {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut loops = Vec::new();
    for (dir, graph) in &by_dir {
        let mut tarjan = Tarjan {
            graph,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            components: Vec::new(),
        };
        for node in graph.keys() {
            if !tarjan.index.contains_key(node.as_str()) {
                tarjan.visit(node);
            }
        }
        for component in tarjan.components {
            loops.push((dir.clone(), component));
        }
    }
    loops
}

/// The loops, each with the paths that close it, for the failure message.
fn describe_loops(src: &Path, uses: &[SiblingUse]) -> Vec<String> {
    sibling_loops(uses)
        .iter()
        .map(|(dir, members)| {
            let edges: Vec<String> = uses
                .iter()
                .filter(|u| &u.dir == dir && members.contains(&u.from) && members.contains(&u.to))
                .map(|u| {
                    format!(
                        "    {} -> {}: {} {}",
                        u.from,
                        u.to,
                        u.file.strip_prefix(src).unwrap_or(&u.file).display(),
                        u.path
                    )
                })
                .collect();
            format!(
                "{}/{{{}}}:\n{}",
                dir.join("/"),
                members.join(", "),
                edges.join("\n")
            )
        })
        .collect()
}

#[test]
fn no_modules_of_a_part_import_each_other_in_a_loop() {
    let uses = sibling_uses(&src());
    assert!(
        uses.len() > 50,
        "the collector found only {} uses between sibling modules: it is not reading the sources",
        uses.len()
    );
    let is_known = |dir: &[String], members: &[String]| {
        KNOWN_LOOPS
            .iter()
            .any(|(d, m, _)| *d == dir.join("/") && m.iter().eq(members.iter()))
    };
    let loops = sibling_loops(&uses);
    let unknown: Vec<(Vec<String>, Vec<String>)> = loops
        .iter()
        .filter(|(dir, members)| !is_known(dir, members))
        .cloned()
        .collect();
    let report: Vec<String> = describe_loops(&src(), &uses)
        .into_iter()
        .zip(&loops)
        .filter(|(_, (dir, members))| !is_known(dir, members))
        .map(|(text, _)| text)
        .collect();
    assert!(
        unknown.is_empty(),
        "{} import loops between modules of one part (move what they share into the module \
         that owns it, or into a small module both use):\n{}",
        unknown.len(),
        report.join("\n")
    );
    let gone: Vec<String> = KNOWN_LOOPS
        .iter()
        .filter(|(d, m, _)| {
            !loops
                .iter()
                .any(|(dir, members)| *d == dir.join("/") && m.iter().eq(members.iter()))
        })
        .map(|(d, m, _)| format!("{d}/{{{}}}", m.join(", ")))
        .collect();
    assert!(
        gone.is_empty(),
        "loops in KNOWN_LOOPS that are gone (take them off the list): {gone:?}"
    );
}

#[test]
fn the_loop_check_sees_siblings_through_paths_and_reexports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = dir.path().join("cluster");
    std::fs::create_dir_all(cluster.join("follow")).expect("mkdir");
    let write = |name: &str, text: &str| std::fs::write(cluster.join(name), text).expect("write");
    write(
        "mod.rs",
        "mod keys; mod values; mod follow; pub use values::Value;\n",
    );
    write("keys.rs", "use super::Value;\npub struct Key;\n");
    write(
        "values.rs",
        "pub struct Value(crate::cluster::keys::Key);\n",
    );
    write(
        "follow/mod.rs",
        "mod inner;\nfn f() { super::keys::Key; }\n",
    );
    write(
        "follow/inner.rs",
        "use super::super::values::Value;\nuse super::Thing;\n",
    );
    let uses = sibling_uses(dir.path());
    let edges: Vec<(String, &str, &str)> = uses
        .iter()
        .map(|u| (u.dir.join("/"), u.from.as_str(), u.to.as_str()))
        .collect();
    assert_eq!(
        edges,
        vec![
            ("cluster".to_owned(), "follow", "keys"),
            ("cluster".to_owned(), "follow", "values"),
            ("cluster".to_owned(), "keys", "values"),
            ("cluster".to_owned(), "values", "keys"),
        ]
    );
    assert_eq!(
        sibling_loops(&uses),
        vec![(
            vec!["cluster".to_owned()],
            vec!["keys".to_owned(), "values".to_owned()]
        )]
    );
}

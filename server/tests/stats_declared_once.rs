//! Every Stats field is declared in two places: the proto (`StatsResponse` in
//! proto/tunecache/v1/tunecache.proto) and one entry of its part's `stats_registry!`
//! (server/src/report/registry.rs), from which come the counter, the fill of the response and
//! the metric row. This test counts, for each field of the proto's `StatsResponse`, the places
//! in `server/src` (test modules, `tests.rs` files and `tests/` directories left out) that
//! declare it, and wants exactly one.
//!
//! What counts as a declaration of a field `f` (counted conservatively: each of these is a
//! place someone adding a counter would have had to name it):
//! - an entry of a `stats_registry!` that names `f` as its Stats field: a cell `f: T`, a cell
//!   `field: T as f`, or a value `f = ...` (a cell marked `internal` is no Stats field);
//! - a write of `f` outside a registry: an assignment to a field `f` (`x.f = ...`, a fill by
//!   hand), or `f: ...` in a `StatsResponse { .. }` literal;
//! - a counter kept outside a registry under the field's name: a struct field `f` of an
//!   atomic type (`AtomicU64`, `AtomicI64`, ...);
//! - a read of `f` in `ops/metrics.rs` (a metric row written by hand).
//!
//! Reads elsewhere (the counter's `fetch_add`, a reporter reading the response) are uses, not
//! declarations, and macro bodies other than registries are not looked into. An assignment
//! that writes something else of the same name is listed in `NOT_STATS`, with its reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::visit_mut::VisitMut;

mod source_tree;
use source_tree::rust_files;

/// Assignments to a field named like a Stats field that write something else: (file under
/// `src`, the assigned place as written, why it is no Stats field).
const NOT_STATS: &[(&str, &str, &str)] = &[(
    "server.rs",
    "config.node_name",
    "the node name the flags resolve to, in the Config",
)];

/// The field names of `message StatsResponse` in the proto's text.
fn proto_fields(proto: &str) -> Vec<String> {
    let start = proto
        .find("message StatsResponse {")
        .expect("StatsResponse in the proto");
    let body = &proto[start..];
    let body = &body[body.find('{').expect("its body") + 1..body.find("\n}").expect("its end")];
    body.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .filter_map(|line| {
            // `[repeated] type name = number;`
            let words: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || c == '=' || c == ';')
                .filter(|w| !w.is_empty())
                .collect();
            let at = if words.first() == Some(&"repeated") {
                1
            } else {
                0
            };
            match words.get(at..at + 3) {
                Some([_, name, number]) if number.parse::<u32>().is_ok() => {
                    Some((*name).to_owned())
                }
                _ => None,
            }
        })
        .collect()
}

/// One place that declares a Stats field.
#[derive(Debug, Clone)]
struct Declaration {
    field: String,
    file: PathBuf,
    what: &'static str,
}

struct Collector<'f> {
    file: &'f Path,
    fields: &'f [String],
    in_metrics: bool,
    found: Vec<Declaration>,
    /// Registry pieces that could not be read: the test fails on them rather than skip them.
    unreadable: Vec<String>,
}

impl Collector<'_> {
    fn declare(&mut self, field: &str, what: &'static str) {
        if self.fields.iter().any(|f| f == field) {
            self.found.push(Declaration {
                field: field.to_owned(),
                file: self.file.to_owned(),
                what,
            });
        }
    }

    /// The entries of one `stats_registry!` invocation.
    fn registry(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let is_ident =
            |tree: &TokenTree, name: &str| matches!(tree, TokenTree::Ident(i) if i == name);
        if let Some(at) = trees.iter().position(|t| is_ident(t, "struct")) {
            // A struct of cells: `struct Name { entries }`.
            let Some(TokenTree::Group(body)) = trees.get(at + 2) else {
                self.unreadable
                    .push(format!("{}: struct without a body", self.file.display()));
                return;
            };
            for entry in split_entries(body.stream()) {
                self.cell(&entry);
            }
        } else if let Some(TokenTree::Group(body)) = trees
            .iter()
            .rev()
            .find(|t| matches!(t, TokenTree::Group(g) if g.delimiter() == Delimiter::Brace))
        {
            // An owner's values: `impl FillStats for Owner { fn ... include ...; fields { } }`.
            let inner: Vec<TokenTree> = body.stream().into_iter().collect();
            let fields =
                inner
                    .iter()
                    .position(|t| is_ident(t, "fields"))
                    .and_then(|at| match inner.get(at + 1) {
                        Some(TokenTree::Group(group)) => Some(group.stream()),
                        _ => None,
                    });
            let Some(fields) = fields else {
                self.unreadable
                    .push(format!("{}: no `fields {{ }}`", self.file.display()));
                return;
            };
            for entry in split_entries(fields) {
                self.value(&entry);
            }
        } else {
            self.unreadable
                .push(format!("{}: neither form", self.file.display()));
        }
    }

    /// `#[..]* vis field: Type [as stat] => spec`
    fn cell(&mut self, entry: &[TokenTree]) {
        let entry = skip_attributes(entry);
        let entry = match entry.first() {
            Some(TokenTree::Ident(i)) if i == "pub" => match entry.get(1) {
                Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => &entry[2..],
                _ => &entry[1..],
            },
            _ => entry,
        };
        let arrow = arrow_at(entry);
        let (Some(TokenTree::Ident(field)), Some(arrow)) = (entry.first(), arrow) else {
            self.unreadable
                .push(format!("{}: cell {}", self.file.display(), show(entry)));
            return;
        };
        if matches!(entry.get(arrow + 2), Some(TokenTree::Ident(i)) if i == "internal") {
            return;
        }
        let alias = entry[..arrow].windows(2).find_map(|pair| match pair {
            [TokenTree::Ident(a), TokenTree::Ident(stat)] if a == "as" => Some(stat.to_string()),
            _ => None,
        });
        let stat = alias.unwrap_or_else(|| field.to_string());
        self.declare(&stat, "a registry's cell");
    }

    /// `#[..]* stat = value [, absent value] => spec`; the `absent` part is a piece of its own.
    fn value(&mut self, entry: &[TokenTree]) {
        let entry = skip_attributes(entry);
        match (entry.first(), entry.get(1)) {
            (Some(TokenTree::Ident(i)), _) if i == "absent" => {}
            (Some(TokenTree::Ident(stat)), Some(TokenTree::Punct(p))) if p.as_char() == '=' => {
                self.declare(&stat.to_string(), "a registry's value");
            }
            _ => self
                .unreadable
                .push(format!("{}: value {}", self.file.display(), show(entry))),
        }
    }
}

/// Splits on the commas outside groups and outside `<..>`.
fn split_entries(tokens: TokenStream) -> Vec<Vec<TokenTree>> {
    let mut entries = vec![Vec::new()];
    let mut angles = 0i32;
    let mut previous_eq = false;
    for tree in tokens {
        if let TokenTree::Punct(p) = &tree {
            match p.as_char() {
                ',' if angles == 0 => {
                    entries.push(Vec::new());
                    previous_eq = false;
                    continue;
                }
                '<' => angles += 1,
                '>' if !previous_eq => angles -= 1,
                _ => {}
            }
            previous_eq = p.as_char() == '=';
        } else {
            previous_eq = false;
        }
        entries.last_mut().expect("one").push(tree);
    }
    entries.retain(|entry| !entry.is_empty());
    entries
}

fn skip_attributes(mut entry: &[TokenTree]) -> &[TokenTree] {
    while let [TokenTree::Punct(p), TokenTree::Group(_), rest @ ..] = entry {
        if p.as_char() != '#' {
            break;
        }
        entry = rest;
    }
    entry
}

/// Where `=>` starts.
fn arrow_at(entry: &[TokenTree]) -> Option<usize> {
    entry.windows(2).position(|pair| {
        matches!(pair, [TokenTree::Punct(a), TokenTree::Punct(b)] if a.as_char() == '=' && b.as_char() == '>')
    })
}

fn show(entry: &[TokenTree]) -> String {
    entry
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr.meta.require_list().is_ok_and(|list| {
                list.tokens
                    .to_string()
                    .split_whitespace()
                    .any(|w| w == "test")
            })
    })
}

impl VisitMut for Collector<'_> {
    fn visit_file_mut(&mut self, file: &mut syn::File) {
        file.items.retain(|item| !item_is_test(item));
        syn::visit_mut::visit_file_mut(self, file);
    }

    fn visit_item_mod_mut(&mut self, item: &mut syn::ItemMod) {
        if let Some((_, items)) = &mut item.content {
            items.retain(|item| !item_is_test(item));
        }
        syn::visit_mut::visit_item_mod_mut(self, item);
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        if mac
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "stats_registry")
        {
            self.registry(mac.tokens.clone());
        }
        syn::visit_mut::visit_macro_mut(self, mac);
    }

    fn visit_expr_assign_mut(&mut self, assign: &mut syn::ExprAssign) {
        if let syn::Expr::Field(field) = &*assign.left {
            let place = written(&assign.left);
            let listed = NOT_STATS
                .iter()
                .any(|(file, at, _)| self.file == Path::new(file) && *at == place);
            if let (syn::Member::Named(name), false) = (&field.member, listed) {
                self.declare(&name.to_string(), "an assignment outside a registry");
            }
        }
        syn::visit_mut::visit_expr_assign_mut(self, assign);
    }

    fn visit_expr_struct_mut(&mut self, literal: &mut syn::ExprStruct) {
        if literal
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "StatsResponse")
        {
            for field in &literal.fields {
                if let syn::Member::Named(name) = &field.member {
                    self.declare(&name.to_string(), "a StatsResponse literal");
                }
            }
        }
        syn::visit_mut::visit_expr_struct_mut(self, literal);
    }

    fn visit_field_mut(&mut self, field: &mut syn::Field) {
        let atomic = match &field.ty {
            syn::Type::Path(path) => path
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident.to_string().starts_with("Atomic")),
            _ => false,
        };
        if let (true, Some(name)) = (atomic, &field.ident) {
            self.declare(&name.to_string(), "an atomic outside a registry");
        }
        syn::visit_mut::visit_field_mut(self, field);
    }

    fn visit_expr_field_mut(&mut self, read: &mut syn::ExprField) {
        if self.in_metrics {
            if let syn::Member::Named(name) = &read.member {
                self.declare(&name.to_string(), "a metric row by hand");
            }
        }
        syn::visit_mut::visit_expr_field_mut(self, read);
    }
}

/// A place as written (`stats.hits`, `self.counters.hits`), `?` for what is not a name.
fn written(expr: &syn::Expr) -> String {
    match expr {
        syn::Expr::Path(path) => path
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect::<Vec<_>>()
            .join("::"),
        syn::Expr::Field(field) => match &field.member {
            syn::Member::Named(name) => format!("{}.{name}", written(&field.base)),
            syn::Member::Unnamed(index) => format!("{}.{}", written(&field.base), index.index),
        },
        _ => "?".to_owned(),
    }
}

fn item_is_test(item: &syn::Item) -> bool {
    match item {
        syn::Item::Mod(m) => is_cfg_test(&m.attrs),
        syn::Item::Fn(f) => is_cfg_test(&f.attrs),
        syn::Item::Impl(i) => is_cfg_test(&i.attrs),
        syn::Item::Use(u) => is_cfg_test(&u.attrs),
        syn::Item::Struct(s) => is_cfg_test(&s.attrs),
        syn::Item::Macro(m) => is_cfg_test(&m.attrs),
        _ => false,
    }
}

/// Every declaration of one of `fields` under `src`, and the registry pieces not understood.
fn declarations(src: &Path, fields: &[String]) -> (Vec<Declaration>, Vec<String>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // Unit tests (a `tests` directory or `tests.rs`) spell Stats fields without declaring them.
    files.retain(|file| {
        !file
            .strip_prefix(src)
            .unwrap_or(file)
            .components()
            .any(|part| part.as_os_str() == "tests" || part.as_os_str() == "tests.rs")
    });
    files.sort();
    let (mut found, mut unreadable) = (Vec::new(), Vec::new());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let mut parsed = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let relative = file.strip_prefix(src).unwrap_or(&file).to_owned();
        let mut collector = Collector {
            file: &relative,
            fields,
            in_metrics: relative == Path::new("ops/metrics.rs"),
            found: Vec::new(),
            unreadable: Vec::new(),
        };
        collector.visit_file_mut(&mut parsed);
        found.extend(collector.found);
        unreadable.extend(collector.unreadable);
    }
    (found, unreadable)
}

/// Fields not declared exactly once, each with where it is declared.
fn not_once(fields: &[String], found: &[Declaration]) -> BTreeMap<String, Vec<String>> {
    let mut places: BTreeMap<String, Vec<String>> =
        fields.iter().map(|f| (f.clone(), Vec::new())).collect();
    for declaration in found {
        places
            .get_mut(&declaration.field)
            .expect("a proto field")
            .push(format!(
                "{} ({})",
                declaration.file.display(),
                declaration.what
            ));
    }
    places.retain(|_, at| at.len() != 1);
    places
}

#[test]
fn every_stats_field_is_declared_in_the_proto_and_one_registry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read_to_string(root.join("../proto/tunecache/v1/tunecache.proto"))
        .expect("read the proto");
    let fields = proto_fields(&proto);
    assert!(
        fields.len() > 150 && fields.iter().any(|f| f == "artifact_shared_dir_squatted"),
        "read only {} Stats fields from the proto: {fields:?}",
        fields.len()
    );
    let (found, unreadable) = declarations(&root.join("src"), &fields);
    assert!(
        unreadable.is_empty(),
        "registry entries not understood: {unreadable:#?}"
    );
    let bad = not_once(&fields, &found);
    let report: Vec<String> = bad
        .iter()
        .map(|(field, at)| match at.as_slice() {
            [] => {
                format!("{field}: declared nowhere in server/src (add it to its part's registry)")
            }
            _ => format!(
                "{field}: declared {} times:\n    {}",
                at.len(),
                at.join("\n    ")
            ),
        })
        .collect();
    assert!(
        bad.is_empty(),
        "each Stats field must be declared twice in all, in the proto and in one entry of its \
         part's stats_registry!; {} are not:\n{}",
        bad.len(),
        report.join("\n")
    );
}

#[test]
fn the_count_sees_registries_fills_by_hand_stray_atomics_and_rows_by_hand() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("ops")).expect("mkdir");
    std::fs::create_dir_all(src.join("store")).expect("mkdir");
    std::fs::write(
        src.join("store/mod.rs"),
        r#"
crate::report::stats_registry! {
    #[derive(Default)]
    pub struct Counters {
        /// Cells: by their name, or the `as` name; `internal` is none.
        pub(crate) hits: AtomicU64 => counter(1, "Hits."),
        written: Mutex<HashMap<u32, String>> as records => not_exported,
        misses: AtomicU64 => internal,
    }
}
crate::report::stats_registry! {
    impl FillStats for Store {
        fn fill_stats(store, stats) { let n = store.len(); }
        include Counters = store.counters;
        fields {
            entries = n as u64, absent 0 => gauge(2, "Entries.", via |n: &u64| n + 1),
            lookups = f(a, b) => not_exported,
        }
    }
}
struct Stray { lookups: std::sync::atomic::AtomicU64, misses: u64 }
fn fill(stats: &mut StatsResponse) {
    stats.misses = 1;
    let _ = StatsResponse { hits: 2, ..Default::default() };
}
#[cfg(test)]
mod tests { fn t(stats: &mut StatsResponse) { stats.entries = 3; } }
"#,
    )
    .expect("write");
    std::fs::write(
        src.join("ops/metrics.rs"),
        "const ROWS: &[Metric] = &[row(\"x\", |s| s.records)];",
    )
    .expect("write");
    std::fs::write(
        src.join("store/tests.rs"),
        "fn t(s: &mut S) { s.hits = 1; }",
    )
    .expect("write");
    let fields: Vec<String> = ["hits", "misses", "records", "entries", "lookups", "waiters"]
        .map(String::from)
        .to_vec();
    let (found, unreadable) = declarations(src, &fields);
    assert!(unreadable.is_empty(), "{unreadable:?}");
    let shown: Vec<(&str, &str)> = found.iter().map(|d| (d.field.as_str(), d.what)).collect();
    assert_eq!(
        shown,
        vec![
            ("records", "a metric row by hand"),
            ("hits", "a registry's cell"),
            ("records", "a registry's cell"),
            ("entries", "a registry's value"),
            ("lookups", "a registry's value"),
            ("lookups", "an atomic outside a registry"),
            ("misses", "an assignment outside a registry"),
            ("hits", "a StatsResponse literal"),
        ]
    );
    let bad: Vec<(String, usize)> = not_once(&fields, &found)
        .into_iter()
        .map(|(field, at)| (field, at.len()))
        .collect();
    assert_eq!(
        bad,
        vec![
            ("hits".to_owned(), 2),
            ("lookups".to_owned(), 2),
            ("records".to_owned(), 2),
            ("waiters".to_owned(), 0),
        ]
    );
}

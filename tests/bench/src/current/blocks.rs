//! The marked blocks of a Markdown file: finding each `report:begin KIND SOURCE` ...
//! `report:end` pair, replacing what is between with the table rendered from its source
//! (or keeping it when the source is gone), and reading the source files. Which text a
//! file gets is decided without the filesystem (`regenerate_with`); [`update`] and
//! [`check`] are the effects.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::render;

const BEGIN: &str = "<!-- report:begin ";
const END: &str = "<!-- report:end -->";

/// Reads a source file: one JSON document, or JSON lines (one row each, as `cluster-v1.jsonl`)
/// read as `{"rows": [...]}`.
pub fn read_source(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(value) => Ok(value),
        Err(_) => {
            let rows = text
                .lines()
                .filter(|line| !line.trim().is_empty())
                .map(serde_json::from_str)
                .collect::<Result<Vec<Value>, _>>()
                .with_context(|| format!("parsing {}", path.display()))?;
            Ok(serde_json::json!({ "rows": rows }))
        }
    }
}

/// What happened to one marked block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub kind: String,
    pub source: PathBuf,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The block already matched its source.
    Unchanged,
    /// The block differed from its source (rewritten by [`update`]).
    Changed,
    /// The source file does not exist; the block was kept as it is.
    SourceMissing,
}

/// Regenerates every marked block of `markdown` (relative sources resolved against `base`).
/// Returns the new text and what happened to each block.
pub fn regenerate(markdown: &str, base: &Path) -> Result<(String, Vec<Block>)> {
    regenerate_with(markdown, |kind, source| {
        let source_path = base.join(source);
        if !source_path.exists() {
            return Ok(None);
        }
        render(kind, &read_source(&source_path)?)
            .with_context(|| format!("{kind} from {source}"))
            .map(Some)
    })
}

/// The rule of [`regenerate`] without the filesystem: every block between a
/// `BEGIN KIND SOURCE -->` line and the next `END` line is replaced by `table(kind, source)`
/// between blank lines, or kept as it is when that is `None` (no source). Every other line
/// is copied as it is.
fn regenerate_with(
    markdown: &str,
    mut table: impl FnMut(&str, &str) -> Result<Option<String>>,
) -> Result<(String, Vec<Block>)> {
    let mut out = String::with_capacity(markdown.len());
    let mut blocks = Vec::new();
    let mut lines = markdown.split_inclusive('\n');
    let mut line_no = 0;
    while let Some(line) = lines.next() {
        line_no += 1;
        out.push_str(line);
        let Some(spec) = line.trim().strip_prefix(BEGIN) else {
            continue;
        };
        let spec = spec.strip_suffix("-->").unwrap_or(spec);
        let mut words = spec.split_whitespace();
        let (Some(kind), Some(source), None) = (words.next(), words.next(), words.next()) else {
            bail!("line {line_no}: expected `{BEGIN}KIND SOURCE -->`");
        };
        let mut old = String::new();
        let mut closed = false;
        for inner in lines.by_ref() {
            line_no += 1;
            if inner.trim() == END {
                closed = true;
                let outcome = match table(kind, source)? {
                    Some(table) => {
                        // Blank lines around the table keep it a table in any Markdown
                        // renderer.
                        let table = format!("\n{table}\n");
                        let outcome = if table == old {
                            Outcome::Unchanged
                        } else {
                            Outcome::Changed
                        };
                        out.push_str(&table);
                        outcome
                    }
                    None => {
                        out.push_str(&old);
                        Outcome::SourceMissing
                    }
                };
                out.push_str(inner);
                blocks.push(Block {
                    kind: kind.to_owned(),
                    source: PathBuf::from(source),
                    outcome,
                });
                break;
            }
            old.push_str(inner);
        }
        if !closed {
            bail!("line {line_no}: `{BEGIN}{kind} {source} -->` has no `{END}`");
        }
    }
    Ok((out, blocks))
}

fn base_of(path: &Path) -> &Path {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Rewrites every marked block of the Markdown file at `path` from its source.
pub fn update(path: &Path) -> Result<Vec<Block>> {
    let markdown =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (text, blocks) = regenerate(&markdown, base_of(path))?;
    if text != markdown {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(blocks)
}

/// What [`update`] would do, without writing.
pub fn check(path: &Path) -> Result<Vec<Block>> {
    let markdown =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(regenerate(&markdown, base_of(path))?.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_rewritten_and_a_missing_source_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pickup.json"),
            r#"{"micro": {"peer_pickup": [{"filesystem": "local", "snapshot_interval_s": 1,
                "samples_ms": [1.0, 2.0], "median_ms": 628.0, "max_ms": 630.0, "missed": 0}]}}"#,
        )
        .unwrap();
        let markdown =
            "# t\n<!-- report:begin peer-pickup pickup.json -->\nstale\n<!-- report:end -->\n\
                        <!-- report:begin multinode absent.json -->\nkept\n<!-- report:end -->\n";
        let (text, blocks) = regenerate(markdown, dir.path()).unwrap();
        assert!(
            text.contains("-->\n\n| filesystem |")
                && text.contains("| local | 1 s | 2 | 628 ms | 630 ms | 0 |\n\n<!-- report:end"),
            "{text}"
        );
        assert!(!text.contains("stale"));
        assert!(text.contains("\nkept\n"));
        assert_eq!(blocks[0].outcome, Outcome::Changed);
        assert_eq!(blocks[1].outcome, Outcome::SourceMissing);
        let (again, blocks) = regenerate(&text, dir.path()).unwrap();
        assert_eq!(again, text);
        assert_eq!(blocks[0].outcome, Outcome::Unchanged);
    }

    #[test]
    fn a_block_gets_its_table_between_blank_lines_or_is_kept_without_a_source() {
        let markdown = "a\n<!-- report:begin memory x.json -->\nold\n<!-- report:end -->\nb\n\
                        <!-- report:begin views gone.json -->\nkept\n<!-- report:end -->\n";
        let mut asked = Vec::new();
        let table = |source: &str| (source == "x.json").then(|| "| t |\n".to_owned());
        let (text, blocks) = regenerate_with(markdown, |kind, source| {
            asked.push(format!("{kind} {source}"));
            Ok(table(source))
        })
        .unwrap();
        assert_eq!(
            text,
            "a\n<!-- report:begin memory x.json -->\n\n| t |\n\n<!-- report:end -->\nb\n\
             <!-- report:begin views gone.json -->\nkept\n<!-- report:end -->\n"
        );
        assert_eq!(asked, ["memory x.json", "views gone.json"]);
        assert_eq!(
            blocks,
            [
                Block {
                    kind: "memory".to_owned(),
                    source: PathBuf::from("x.json"),
                    outcome: Outcome::Changed,
                },
                Block {
                    kind: "views".to_owned(),
                    source: PathBuf::from("gone.json"),
                    outcome: Outcome::SourceMissing,
                },
            ]
        );
        // The same tables again: nothing changes.
        let (again, blocks) = regenerate_with(&text, |_, source| Ok(table(source))).unwrap();
        assert_eq!(again, text);
        assert_eq!(blocks[0].outcome, Outcome::Unchanged);
        // A table that cannot be rendered fails the whole file.
        let error = regenerate_with(markdown, |_, _| bail!("no rows")).unwrap_err();
        assert_eq!(error.to_string(), "no rows");
    }

    #[test]
    fn a_marker_names_exactly_a_kind_and_a_source() {
        for marker in [
            "<!-- report:begin memory -->",
            "<!-- report:begin memory a.json b.json -->",
        ] {
            let markdown = format!("x\n{marker}\n<!-- report:end -->\n");
            let error = regenerate_with(&markdown, |_, _| Ok(None))
                .unwrap_err()
                .to_string();
            assert_eq!(
                error, "line 2: expected `<!-- report:begin KIND SOURCE -->`",
                "{marker}"
            );
        }
    }

    #[test]
    fn an_unclosed_block_is_an_error() {
        let error = regenerate("<!-- report:begin memory x.json -->\n", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no `<!-- report:end -->`"), "{error}");
    }
}

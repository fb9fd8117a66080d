//! The artifact store knows no transport (issue 49): nothing in `server/src/artifacts/`
//! outside its test modules names tonic or a `tunecache.v1` message; its answers are
//! `ArtifactError`, which becomes a gRPC status in one place, `rpc/artifacts.rs`.

use std::path::Path;

mod source_tree;
use source_tree::rust_files;

/// The text of `file` before its test module, if it has one; nothing of a `tests.rs` file.
fn non_test_text(file: &Path) -> String {
    if file.file_name().is_some_and(|name| name == "tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(file).expect("a readable source file");
    match text.find("#[cfg(test)]") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[test]
fn the_artifact_store_names_no_transport_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("artifacts"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        for (n, line) in non_test_text(file).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["tonic", "v1::", "tunecache_proto::v1"]
                .iter()
                .any(|name| code.contains(name))
            {
                found.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(&src).unwrap_or(file).display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "transport types in artifacts/:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_store_answers_become_statuses_in_one_place() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let places: Vec<String> = files
        .iter()
        .filter(|file| non_test_text(file).contains("impl From<ArtifactError> for"))
        .map(|file| {
            file.strip_prefix(&src)
                .unwrap_or(file)
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(places, ["rpc/artifacts.rs"]);
}

//! Every file the daemon puts in place whole goes through `fsx::atomic` (a temporary file in
//! the same directory, synced, renamed or linked over its name, the directory synced): this
//! test fails on a file of `server/src` outside `fsx/` that syncs, renames or links files
//! itself, unless `OTHER_USES` lists it with its reason (and on a listed file that no longer
//! does, so the list stays true).

use std::path::Path;

mod source_tree;
use source_tree::rust_files;

/// What spells a part of the sequence.
const STEPS: &[&str] = &[".sync_all()", ".sync_data()", "rename(", "hard_link("];

/// Files that use one of the steps for something other than putting a file in place whole:
/// (path under `server/src`, reason).
const OTHER_USES: &[(&str, &str)] = &[
    (
        "journal/append.rs",
        "the journal's appends are synced as they are written",
    ),
    (
        "journal/replace.rs",
        "the journal syncs the directory handle it keeps open (the rename is fsx::atomic's)",
    ),
    (
        "journal/replay.rs",
        "a damaged journal is kept by a link beside it, never replaced",
    ),
    (
        "snapshot/blobs/sweep.rs",
        "the blob sweep moves blobs to and from its trash; it writes none",
    ),
];

#[test]
fn only_fsx_atomic_puts_files_in_place() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut spelled = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let name = relative.to_string_lossy().into_owned();
        if name.starts_with("fsx/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let uses = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .any(|line| STEPS.iter().any(|step| line.contains(step)));
        if uses {
            spelled.push(name);
        }
    }
    let unlisted: Vec<&String> = spelled
        .iter()
        .filter(|name| !OTHER_USES.iter().any(|(listed, _)| listed == name))
        .collect();
    assert!(
        unlisted.is_empty(),
        "files that sync, rename or link files themselves: put the file in place with \
         fsx::atomic, or list the file in OTHER_USES with its reason: {unlisted:?}"
    );
    let gone: Vec<&str> = OTHER_USES
        .iter()
        .map(|(listed, _)| *listed)
        .filter(|listed| !spelled.iter().any(|name| name == listed))
        .collect();
    assert!(
        gone.is_empty(),
        "OTHER_USES lists files that no longer use a step (take them off): {gone:?}"
    );
}

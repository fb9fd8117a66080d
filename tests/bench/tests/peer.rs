//! Integration tests of the file-lock peer through real rank processes: the final file holds
//! every rank's entries and the shared ones exactly once, "after" writes the shared section
//! only from rank 0 and skips a save with nothing new, "before" loses no entry with 8
//! concurrent ranks, and "after" skips a corrupt or empty cache on load. No timing asserts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunecache_bench::cache_file::{rank_section, CacheDocument, SHARED_SECTION};
use tunecache_bench::filelock::{FileLockCache, SaveOutcome, Variant};
use tunecache_bench::scenario::{run_scenario, FileLockPeer, RankReport, ScenarioSpec};
use tunecache_bench::workload::{tuned_entries, NEW_EPOCH};

fn rank_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_filelock-rank"))
}

fn spec(dir: &Path, ranks: u32, existing: usize, new_entries: usize) -> ScenarioSpec {
    ScenarioSpec {
        dir: dir.to_path_buf(),
        ranks,
        existing,
        new_entries,
        shared_fraction: 0.5,
    }
}

/// Checks the final file: every rank's new entries in its section, every shared new entry in
/// `shared`, and each shared key's text present exactly once in the file.
fn assert_all_entries_saved(variant: Variant, ranks: u32) {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec(dir.path(), ranks, 300, 40);
    let result =
        run_scenario(&mut FileLockPeer::new(variant, rank_binary()), &spec).expect("scenario runs");
    assert!(
        result.failures.is_empty(),
        "rank failures: {:?}",
        result.failures
    );
    assert_eq!(result.ranks.len(), ranks as usize);

    let cache_path = FileLockPeer::cache_path(&spec);
    let text = std::fs::read_to_string(&cache_path).expect("cache file");
    let document = CacheDocument::read(&cache_path).expect("valid cache file");
    assert!(document.metadata.is_some());
    let shared = document.section(SHARED_SECTION).expect("shared section");
    for rank in 0..ranks {
        let tuned = tuned_entries(rank, NEW_EPOCH, spec.new_entries, spec.shared_fraction);
        let section = document.section(&rank_section(rank)).expect("rank section");
        for (key, entry) in &tuned.own {
            assert_eq!(
                section.get(key),
                Some(entry),
                "{variant}: rank {rank} lost {key}"
            );
        }
        for (key, entry) in &tuned.shared {
            assert_eq!(shared.get(key), Some(entry), "{variant}: shared lost {key}");
            let quoted = serde_json::to_string(key).expect("key as JSON");
            assert_eq!(
                text.matches(&quoted).count(),
                1,
                "{variant}: {key} not exactly once"
            );
        }
    }
}

#[test]
fn before_with_eight_ranks_loses_no_entry() {
    assert_all_entries_saved(Variant::Before, 8);
}

#[test]
fn after_with_eight_ranks_loses_no_entry() {
    assert_all_entries_saved(Variant::After, 8);
}

fn run_one_rank(variant: Variant, cache: &Path, rank: u32, new_entries: usize) -> RankReport {
    let output = Command::new(rank_binary())
        .args(["--variant", &variant.to_string(), "--cache"])
        .arg(cache)
        .args([
            "--rank",
            &rank.to_string(),
            "--new-entries",
            &new_entries.to_string(),
        ])
        .args(["--shared-fraction", "0.5"])
        .output()
        .expect("run filelock-rank");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("utf-8 report");
    serde_json::from_str(stdout.trim()).expect("one JSON report line")
}

#[test]
fn after_writes_shared_section_only_from_rank_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache.json");
    run_one_rank(Variant::After, &cache, 1, 10);
    let document = CacheDocument::read(&cache).expect("cache written by rank 1");
    let tuned_by_one = tuned_entries(1, NEW_EPOCH, 10, 0.5);
    assert!(document
        .section(SHARED_SECTION)
        .is_none_or(|shared| shared.is_empty()));
    assert_eq!(document.section(&rank_section(1)), Some(&tuned_by_one.own));

    run_one_rank(Variant::After, &cache, 0, 10);
    let document = CacheDocument::read(&cache).expect("cache after rank 0");
    let tuned_by_zero = tuned_entries(0, NEW_EPOCH, 10, 0.5);
    assert_eq!(
        document.section(SHARED_SECTION),
        Some(&tuned_by_zero.shared)
    );
    assert_eq!(document.section(&rank_section(1)), Some(&tuned_by_one.own));
}

#[test]
fn after_does_no_write_when_nothing_is_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache.json");
    let first = run_one_rank(Variant::After, &cache, 0, 20);
    assert_eq!(first.save_outcome, "written");
    let before = std::fs::read(&cache).expect("cache");
    let inode_before =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cache).expect("stat"));

    let second = run_one_rank(Variant::After, &cache, 0, 20);
    assert_eq!(second.save_outcome, "nothing_new");
    assert_eq!(second.bytes_written, 0);
    assert_eq!(std::fs::read(&cache).expect("cache"), before);
    let inode_after =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cache).expect("stat"));
    assert_eq!(
        inode_before, inode_after,
        "file was replaced although nothing was new"
    );
    assert!(!dir.path().join("cache.json.lock").exists() || second.warnings == 0);
}

#[test]
fn after_load_skips_corrupt_and_empty_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache.json");
    for (contents, expect_warning) in [(&b"{\"shared\": {\"('trtllm"[..], true), (&b""[..], false)]
    {
        std::fs::write(&cache, contents).expect("write bad cache");
        let mut rank = FileLockCache::new(Variant::After, &cache, 0, Duration::from_secs(1));
        let tuned = tuned_entries(0, NEW_EPOCH, 4, 0.5);
        rank.insert_tuned(&tuned.shared, &tuned.own);
        let load = rank.load().expect("after load never fails on a bad file");
        assert!(load.skipped);
        assert_eq!(
            load.warnings.len(),
            usize::from(expect_warning),
            "{:?}",
            load.warnings
        );
        assert_eq!(rank.own(), &tuned.own, "a skipped load must keep memory");
        // The next save replaces the bad file with a valid one.
        let save = rank.save().expect("save over a bad file");
        assert_eq!(save.outcome, SaveOutcome::Written);
        CacheDocument::read(&cache).expect("valid after save");
    }
    // "before" fails on a corrupt file, as the old autotuner did.
    std::fs::write(&cache, b"{not json").expect("write corrupt cache");
    let mut before = FileLockCache::new(Variant::Before, &cache, 0, Duration::from_secs(1));
    assert!(before.load().is_err());
}

#[test]
fn after_load_merges_into_memory_with_the_file_winning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache.json");
    run_one_rank(Variant::After, &cache, 0, 4);
    let mut rank = FileLockCache::new(Variant::After, &cache, 0, Duration::from_secs(1));
    let unsaved = tuned_entries(0, NEW_EPOCH + 1, 2, 0.0);
    rank.insert_tuned(&Default::default(), &unsaved.own);
    let load = rank.load().expect("load");
    assert_eq!(load.entries_loaded, 4);
    for key in unsaved.own.keys() {
        assert!(rank.own().contains_key(key), "load dropped unsaved {key}");
    }
}

#[test]
fn after_save_gives_up_after_the_lock_timeout_and_keeps_the_entry() {
    // Another process must hold the lock: POSIX locks never conflict within one process.
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache.json");
    let lock_path = dir.path().join("cache.json.lock");
    let holder = Command::new("python3")
        .args([
            "-c",
            "import fcntl, sys, time\n\
             f = open(sys.argv[1], 'a')\n\
             fcntl.lockf(f, fcntl.LOCK_EX)\n\
             print('held', flush=True)\n\
             time.sleep(30)",
        ])
        .arg(&lock_path)
        .stdout(std::process::Stdio::piped())
        .spawn();
    let Ok(mut holder) = holder else {
        println!("SKIPPED: python3 is not available to hold the lock from another process");
        return;
    };
    let mut held = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("holder stdout")),
        &mut held,
    )
    .expect("holder reports");
    assert_eq!(held.trim(), "held");

    let mut rank = FileLockCache::new(Variant::After, &cache, 0, Duration::from_millis(300));
    let tuned = tuned_entries(0, NEW_EPOCH, 4, 0.5);
    rank.insert_tuned(&tuned.shared, &tuned.own);
    let save = rank.save().expect("bounded save");
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(save.outcome, SaveOutcome::LockTimeout);
    assert_eq!(save.warnings.len(), 1);
    assert!(!cache.exists(), "a timed-out save must not write");
    assert_eq!(rank.own(), &tuned.own, "the unsaved entries stay in memory");
    let retried = rank.save().expect("save once the lock is free");
    assert_eq!(retried.outcome, SaveOutcome::Written);
}

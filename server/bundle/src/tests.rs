//! Unit tests of the bundle format: round trips, reproducibility, every flipped byte caught,
//! trust, key files, refusals at write, diff, and a large artifact in bounded memory.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use sha2::{Digest, Sha256};

use crate::hashing::hex;
use crate::*;

fn key(namespace: &str, op: &str, problem: &str, rank: Option<u32>) -> Key {
    Key {
        namespace: namespace.to_owned(),
        op: op.to_owned(),
        device: "NVIDIA H200|sm_90".to_owned(),
        problem: problem.to_owned(),
        rank,
    }
}

fn entry(key: Key, config: &str, time_us: f64, artifacts: Vec<Artifact>) -> Entry {
    Entry {
        key: Some(key),
        result: Some(TunedResult {
            config: config.to_owned(),
            time_us,
            tuned_by: "test".to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts,
        }),
    }
}

fn artifact(name: &str, content: &[u8]) -> Artifact {
    Artifact {
        name: name.to_owned(),
        sha256: hex(&Sha256::digest(content)),
        size: content.len() as u64,
    }
}

/// Blobs by digest, handed to the writer as `open_artifact` does.
struct Blobs(Vec<Vec<u8>>);

impl Blobs {
    fn open(&self) -> impl FnMut(&Artifact) -> std::io::Result<Box<dyn Read>> + '_ {
        move |wanted: &Artifact| {
            let found = self
                .0
                .iter()
                .find(|blob| hex(&Sha256::digest(blob)) == wanted.sha256)
                .ok_or_else(|| std::io::Error::other("no such blob"))?;
            Ok(Box::new(std::io::Cursor::new(found.clone())) as Box<dyn Read>)
        }
    }
}

/// A few entries in two namespaces, two of them naming the same blob and one another.
fn sample() -> (Vec<Entry>, Blobs) {
    let kernel = b"compiled kernel bytes".repeat(40);
    let module = b"a module".to_vec();
    let entries = vec![
        entry(
            key("trtllm", "fused_moe", "m=1", Some(1)),
            "{\"tactic\":3}",
            12.5,
            vec![artifact("kernel.cubin", &kernel)],
        ),
        entry(
            key("trtllm", "fused_moe", "m=1", None),
            "{\"tactic\":2}",
            13.0,
            vec![],
        ),
        entry(
            key("bitblas", "matmul", "M=1,N=1024", None),
            "{\"block\":128}",
            41.5,
            vec![
                artifact("kernel.cubin", &kernel),
                artifact("mod.so", &module),
            ],
        ),
    ];
    (entries, Blobs(vec![kernel, module]))
}

fn signing_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn write_to_vec(entries: Vec<Entry>, blobs: &Blobs, options: &WriteOptions) -> Vec<u8> {
    let mut out = Vec::new();
    write_bundle(&mut out, entries, &mut blobs.open(), options).expect("write the bundle");
    out
}

fn file_with(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn sorted(mut entries: Vec<Entry>) -> Vec<Entry> {
    entries.sort_by(|a, b| format::key_order(a.key.as_ref().unwrap(), b.key.as_ref().unwrap()));
    entries
}

#[test]
fn a_bundle_round_trips_entries_and_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let (entries, blobs) = sample();
    let options = WriteOptions {
        created_unix_s: 1_700_000_000,
        signing_key: Some(signing_key(1)),
        zstd_level: 3,
    };
    let mut out = Vec::new();
    let written = write_bundle(&mut out, entries.clone(), &mut blobs.open(), &options).unwrap();
    assert_eq!((written.entries, written.artifacts), (3, 2));
    assert_eq!(written.bytes, out.len() as u64);
    let path = file_with(dir.path(), "b.tcb", &out);
    let bundle = Bundle::open(&path).unwrap();
    assert_eq!(bundle.manifest(), &written.manifest);
    assert_eq!(bundle.manifest().namespaces, ["bitblas", "trtllm"]);
    assert_eq!(bundle.manifest().devices, ["NVIDIA H200|sm_90"]);
    assert_eq!(bundle.signer(), Some(&signing_key(1).verifying_key()));
    let verified = bundle.verify_parts().unwrap();
    assert_eq!(verified.parts, 3);
    assert_eq!(bundle.entries().unwrap(), sorted(entries));
    // Artifacts read side by side, each on its own handle.
    let readers: Vec<_> = blobs
        .0
        .iter()
        .map(|blob| {
            let digest = hex(&Sha256::digest(blob));
            assert_eq!(bundle.artifact(&digest).unwrap().size, blob.len() as u64);
            (blob.clone(), bundle.open_artifact(&digest).unwrap())
        })
        .collect();
    std::thread::scope(|scope| {
        for (blob, mut reader) in readers {
            scope.spawn(move || {
                let mut content = Vec::new();
                reader.read_to_end(&mut content).unwrap();
                assert_eq!(content, blob);
            });
        }
    });
    assert!(bundle.open_artifact(&"0".repeat(64)).is_err());
}

#[test]
fn two_writes_of_the_same_entries_are_byte_identical() {
    let (entries, blobs) = sample();
    let options = WriteOptions {
        created_unix_s: 42,
        signing_key: Some(signing_key(1)),
        zstd_level: 3,
    };
    let first = write_to_vec(entries.clone(), &blobs, &options);
    let mut reversed = entries.clone();
    reversed.reverse();
    assert!(first == write_to_vec(reversed, &blobs, &options));
    let later = WriteOptions {
        created_unix_s: 43,
        ..options
    };
    assert!(first != write_to_vec(entries, &blobs, &later));
}

/// Opens, verifies and decodes a bundle: what a reader does before it uses one.
fn read_whole(path: &Path) -> Result<(), BundleError> {
    let bundle = Bundle::open(path)?;
    bundle.verify_parts()?;
    bundle.entries()?;
    Ok(())
}

#[test]
fn every_flipped_byte_of_a_bundle_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (entries, blobs) = sample();
    for signing_key in [None, Some(signing_key(3))] {
        let options = WriteOptions {
            created_unix_s: 7,
            signing_key,
            zstd_level: 3,
        };
        let bytes = write_to_vec(entries.clone(), &blobs, &options);
        read_whole(&file_with(dir.path(), "whole.tcb", &bytes)).expect("the intact bundle");
        for position in 0..bytes.len() {
            for flip in [0x01u8, 0x80] {
                let mut damaged = bytes.clone();
                damaged[position] ^= flip;
                let path = file_with(dir.path(), "damaged.tcb", &damaged);
                assert!(
                    read_whole(&path).is_err(),
                    "byte {position} of {} xor {flip:#x} went unnoticed",
                    bytes.len()
                );
            }
        }
        // Cut short or lengthened: the trailer no longer adds up.
        for damaged in [&bytes[..bytes.len() - 1], &[&bytes[..], b"x"].concat()[..]] {
            let path = file_with(dir.path(), "damaged.tcb", damaged);
            assert!(read_whole(&path).is_err());
        }
    }
}

#[test]
fn a_damaged_artifact_names_its_part() {
    let dir = tempfile::tempdir().unwrap();
    let (entries, blobs) = sample();
    let bytes = write_to_vec(entries, &blobs, &WriteOptions::default());
    let path = file_with(dir.path(), "whole.tcb", &bytes);
    let part = Bundle::open(&path).unwrap().manifest().artifacts[1].clone();
    let mut damaged = bytes.clone();
    damaged[(part.offset + part.stored_len / 2) as usize] ^= 0x10;
    let path = file_with(dir.path(), "damaged.tcb", &damaged);
    let bundle = Bundle::open(&path).unwrap();
    let error = bundle.verify_parts().unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("part \"artifact {}…\": ", &part.sha256[..16])),
        "{error}"
    );
    // Read on its own, the artifact fails instead of ending.
    let mut content = Vec::new();
    let read = bundle
        .open_artifact(&part.sha256)
        .unwrap()
        .read_to_end(&mut content);
    assert!(read.is_err());
}

#[test]
fn trust_needs_a_signature_by_a_trusted_key() {
    let dir = tempfile::tempdir().unwrap();
    let (entries, blobs) = sample();
    let signed = WriteOptions {
        signing_key: Some(signing_key(1)),
        ..WriteOptions::default()
    };
    let signed = file_with(
        dir.path(),
        "s.tcb",
        &write_to_vec(entries.clone(), &blobs, &signed),
    );
    let unsigned = file_with(
        dir.path(),
        "u.tcb",
        &write_to_vec(entries, &blobs, &WriteOptions::default()),
    );
    let (ours, theirs) = (
        signing_key(1).verifying_key(),
        signing_key(2).verifying_key(),
    );
    let signed = Bundle::open(&signed).unwrap();
    let unsigned = Bundle::open(&unsigned).unwrap();
    signed.check_trust(&[]).unwrap();
    signed.check_trust(&[theirs, ours]).unwrap();
    unsigned.check_trust(&[]).unwrap();
    assert_eq!(unsigned.signer(), None);
    let error = signed.check_trust(&[theirs]).unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "part \"signature\": signed by {}, not by a trusted key",
            fingerprint(&ours)
        )
    );
    let error = unsigned.check_trust(&[ours]).unwrap_err().to_string();
    assert!(error.contains("unsigned"), "{error}");
}

#[test]
fn a_signing_key_file_is_read_only_when_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = signing_key(9);
    let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
    let path = file_with(dir.path(), "k.pem", pem.as_bytes());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = read_signing_key(&path).unwrap_err().to_string();
    assert!(error.contains("mode 0644: refused"), "{error}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(read_signing_key(&path).unwrap().to_bytes(), key.to_bytes());
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    let public = file_with(dir.path(), "k.pub", public.as_bytes());
    assert_eq!(read_verifying_key(&public).unwrap(), key.verifying_key());
    // A public key where the private one belongs, and the other way round.
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(read_signing_key(&public).is_err());
    assert!(read_verifying_key(&path).is_err());
    assert_eq!(
        fingerprint(&key.verifying_key()),
        format!(
            "SHA256:{}",
            hex(&Sha256::digest(key.verifying_key().as_bytes()))
        )
    );
}

#[test]
fn keys_openssl_writes_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("k.pem");
    let public = dir.path().join("k.pub");
    let run = |args: &[&std::ffi::OsStr]| std::process::Command::new("openssl").args(args).status();
    let made = run(&[
        "genpkey".as_ref(),
        "-algorithm".as_ref(),
        "ed25519".as_ref(),
        "-out".as_ref(),
        private.as_os_str(),
    ]);
    if !made.is_ok_and(|status| status.success()) {
        eprintln!("SKIPPED: no openssl that makes Ed25519 keys");
        return;
    }
    let status = run(&[
        "pkey".as_ref(),
        "-in".as_ref(),
        private.as_os_str(),
        "-pubout".as_ref(),
        "-out".as_ref(),
        public.as_os_str(),
    ])
    .unwrap();
    assert!(status.success());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = read_signing_key(&private).unwrap();
    assert_eq!(read_verifying_key(&public).unwrap(), key.verifying_key());
}

#[test]
fn artifact_bytes_that_do_not_match_their_digest_are_refused_at_write() {
    let (entries, _) = sample();
    for wrong in [b"other bytes".to_vec(), Vec::new(), vec![b'x'; 100_000]] {
        let mut open =
            |_: &Artifact| Ok(Box::new(std::io::Cursor::new(wrong.clone())) as Box<dyn Read>);
        let mut out = Vec::new();
        let error = write_bundle(
            &mut out,
            entries.clone(),
            &mut open,
            &WriteOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(error, BundleError::Input(_)), "{error}");
        assert!(error.to_string().contains("do not match"), "{error}");
    }
    // A source that cannot be opened fails the write too.
    let mut open =
        |_: &Artifact| -> std::io::Result<Box<dyn Read>> { Err(std::io::Error::other("gone")) };
    assert!(write_bundle(Vec::new(), entries, &mut open, &WriteOptions::default()).is_err());
}

#[test]
fn a_key_given_twice_is_refused_at_write() {
    let (mut entries, blobs) = sample();
    let mut twice = entries[1].clone();
    twice.result.as_mut().unwrap().time_us = 1.0;
    entries.push(twice);
    let error = write_bundle(
        Vec::new(),
        entries,
        &mut blobs.open(),
        &WriteOptions::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("given twice"), "{error}");
}

#[test]
fn diff_reports_exactly_the_changed_entry() {
    let (a, _) = sample();
    let mut b = a.clone();
    b.reverse();
    // Re-tuned elsewhere, the same result: no change.
    b[0].result.as_mut().unwrap().tuned_by = "another node".to_owned();
    assert!(diff::diff(a.clone(), b.clone()).is_empty());
    let changed = b
        .iter_mut()
        .find(|entry| entry.key.as_ref().unwrap().rank == Some(1))
        .unwrap();
    changed.result.as_mut().unwrap().time_us = 11.0;
    let only_b = entry(key("trtllm", "gemm", "n=8", None), "{}", 1.0, vec![]);
    b.push(only_b.clone());
    let removed = b.remove(1);
    let found = diff::diff(a.clone(), b);
    assert_eq!(found.only_in_b, vec![only_b]);
    assert_eq!(found.only_in_a, vec![removed]);
    assert_eq!(found.different.len(), 1);
    assert_eq!(found.different[0].a, a[0]);
    assert_eq!(found.different[0].fields, ["time_us"]);
}

/// Pseudo-random bytes made as they are read (xorshift), never held whole.
struct Generated {
    state: u64,
    left: u64,
}

impl Generated {
    fn new(seed: u64, size: u64) -> Generated {
        Generated {
            state: seed | 1,
            left: size,
        }
    }
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for byte in &mut buf[..n] {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            *byte = self.state as u8;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Hashes everything `reader` reads.
fn digest_of(mut reader: impl Read) -> (String, u64) {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            return (hex(&hasher.finalize()), size);
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
}

#[test]
fn a_64_mib_artifact_round_trips_streamed() {
    const SIZE: u64 = 64 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let (sha256, size) = digest_of(Generated::new(5, SIZE));
    let big = Artifact {
        name: "big.so".to_owned(),
        sha256: sha256.clone(),
        size,
    };
    let entries = vec![entry(key("ns", "op", "p", None), "{}", 1.0, vec![big])];
    let mut open = |_: &Artifact| Ok(Box::new(Generated::new(5, SIZE)) as Box<dyn Read>);
    let path = dir.path().join("big.tcb");
    let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let options = WriteOptions {
        zstd_level: 1,
        ..WriteOptions::default()
    };
    let written = write_bundle(file, entries, &mut open, &options).unwrap();
    assert_eq!(written.artifact_bytes, SIZE);
    let bundle = Bundle::open(&path).unwrap();
    assert_eq!(
        bundle.verify_parts().unwrap().content_bytes,
        SIZE + bundle.manifest().entries.content_len
    );
    assert_eq!(
        digest_of(bundle.open_artifact(&sha256).unwrap()),
        (sha256, SIZE)
    );
    let _ = std::io::stdout().flush();
}

#[test]
fn a_bundle_of_no_entries_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = write_to_vec(Vec::new(), &Blobs(Vec::new()), &WriteOptions::default());
    let bundle = Bundle::open(&file_with(dir.path(), "empty.tcb", &bytes)).unwrap();
    assert_eq!(bundle.verify_parts().unwrap().parts, 1);
    assert_eq!(bundle.entries().unwrap(), Vec::<Entry>::new());
    assert!(bundle.manifest().namespaces.is_empty());
}

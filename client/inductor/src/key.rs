//! The keys of Inductor's results, both ways: the `Key` of a GEMM timing group (its system, op,
//! cache key, precision and choice set) and of a kernel's best config (its file and configs
//! hash), and the parts that export reads back from a stored key to know which file, and where
//! in it, the result goes.

use sha2::{Digest, Sha256};
use tunecache_proto::v1;

use crate::{BEST_CONFIG_NAMESPACE, BEST_CONFIG_OP, NAMESPACE};

const SYSTEM: &str = "system ";
const PRECISION: &str = "|precision ";
const CHOICES: &str = "|choices ";
const CONFIGS: &str = "|configs ";
/// Hex digits of the choice digest: 128 bits, so two choice sets never meet by chance.
const CHOICE_DIGEST_HEX: usize = 32;

/// `Key.device` of a system (`CacheBase.get_system()`): `<name>|system <hash>` when the system
/// names its device, else `system <hash>`. The hash covers the device, Triton and CUDA/HIP
/// versions, so two systems' timings never meet; the name is there for people reading keys.
pub fn device(system_hash: &str, device_name: Option<&str>) -> String {
    match device_name {
        Some(name) if !name.is_empty() => format!("{name}|{SYSTEM}{system_hash}"),
        _ => format!("{SYSTEM}{system_hash}"),
    }
}

/// The system hash a `Key.device` built by [`device`] names.
pub fn system_hash_of_device(device: &str) -> Option<&str> {
    let hash = match device.rsplit_once(&format!("|{SYSTEM}")) {
        Some((_, hash)) => hash,
        None => device.strip_prefix(SYSTEM)?,
    };
    (!hash.is_empty()).then_some(hash)
}

/// The device name a `Key.device` built by [`device`] names, if any.
pub fn device_name_of_device(device: &str) -> Option<&str> {
    device
        .rsplit_once(&format!("|{SYSTEM}"))
        .map(|(name, _)| name)
}

/// The first 32 hex digits of the SHA-256 of `choice_hashes`, sorted and deduplicated, joined
/// by `\n`: the same for the same set, whichever order Inductor listed the choices in.
pub fn choices_digest(choice_hashes: &[impl AsRef<str>]) -> String {
    let mut sorted: Vec<&str> = choice_hashes.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let digest = Sha256::digest(sorted.join("\n").as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex[..CHOICE_DIGEST_HEX].to_owned()
}

/// `Key.problem` of a timing group: `<cache_key>|precision <precision>|choices <digest>`.
/// Inductor serves a lookup only when every choice it benchmarks has a timing, so the choice
/// set is part of the problem: a lookup of other choices is another problem.
pub fn gemm_problem(cache_key: &str, precision: &str, choice_hashes: &[impl AsRef<str>]) -> String {
    format!(
        "{cache_key}{PRECISION}{precision}{CHOICES}{}",
        choices_digest(choice_hashes)
    )
}

/// `(cache_key, precision, choices_digest)` of a problem built by [`gemm_problem`]. Split from
/// the right: Inductor's precisions (`highest`, `high`, `medium`) and the digest hold no `|`,
/// a cache key may.
pub fn gemm_problem_parts(problem: &str) -> Option<(&str, &str, &str)> {
    let (rest, digest) = problem.rsplit_once(CHOICES)?;
    let (cache_key, precision) = rest.rsplit_once(PRECISION)?;
    Some((cache_key, precision, digest))
}

/// The key of one timing group `cache[op][cache_key][precision]` of the system's file.
pub fn gemm_key(
    system_hash: &str,
    device_name: Option<&str>,
    op: &str,
    cache_key: &str,
    precision: &str,
    choice_hashes: &[impl AsRef<str>],
) -> v1::Key {
    v1::Key {
        namespace: NAMESPACE.to_owned(),
        op: op.to_owned(),
        device: device(system_hash, device_name),
        problem: gemm_problem(cache_key, precision, choice_hashes),
        rank: None,
    }
}

/// The key of a kernel's best config: its file `<dir>/<name>.best_config` relative to the cache
/// directory (the kernel's source hash names both) and the hash of the configs it was chosen
/// among, which Inductor checks on load. No device: the kernel hash already covers what the
/// kernel was compiled for, and Inductor keeps these files outside any system's.
pub fn best_config_key(rel_path: &str, configs_hash: &str) -> v1::Key {
    v1::Key {
        namespace: BEST_CONFIG_NAMESPACE.to_owned(),
        op: BEST_CONFIG_OP.to_owned(),
        device: String::new(),
        problem: format!("{rel_path}{CONFIGS}{configs_hash}"),
        rank: None,
    }
}

/// `(rel_path, configs_hash)` of a problem built by [`best_config_key`].
pub fn best_config_parts(problem: &str) -> Option<(&str, &str)> {
    problem.rsplit_once(CONFIGS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_spelled_exactly() {
        assert_eq!(device("abc", Some("NVIDIA H100")), "NVIDIA H100|system abc");
        assert_eq!(device("abc", Some("")), "system abc");
        assert_eq!(device("abc", None), "system abc");
        assert_eq!(system_hash_of_device("NVIDIA H100|system abc"), Some("abc"));
        assert_eq!(system_hash_of_device("system abc"), Some("abc"));
        assert_eq!(system_hash_of_device("NVIDIA H100"), None);
        assert_eq!(device_name_of_device("N|system abc"), Some("N"));
        assert_eq!(device_name_of_device("system abc"), None);

        // hashlib.sha256("a\nb".encode()).hexdigest()[:32]
        let expected = "7e18f737311b2dc3b2f269dd78396b03";
        assert_eq!(choices_digest(&["b", "a", "b"]), expected);
        assert_eq!(hex_prefix(b"a\nb"), expected);
        let key = gemm_key("abc", Some("G"), "mm", "k|1", "high", &["b", "a"]);
        assert_eq!(
            key,
            v1::Key {
                namespace: "inductor".to_owned(),
                op: "mm".to_owned(),
                device: "G|system abc".to_owned(),
                problem: format!("k|1|precision high|choices {expected}"),
                rank: None,
            }
        );
        assert_eq!(
            gemm_problem_parts(&key.problem),
            Some(("k|1", "high", expected))
        );

        let best = best_config_key("ab/cabc.best_config", "f00");
        assert_eq!(
            (
                best.namespace.as_str(),
                best.op.as_str(),
                best.device.as_str()
            ),
            ("inductor.best_config", "best_config", "")
        );
        assert_eq!(best.problem, "ab/cabc.best_config|configs f00");
        assert_eq!(
            best_config_parts(&best.problem),
            Some(("ab/cabc.best_config", "f00"))
        );
    }

    fn hex_prefix(bytes: &[u8]) -> String {
        let digest = Sha256::digest(bytes);
        digest
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()[..32]
            .to_owned()
    }

    #[test]
    fn the_digest_is_the_set_not_the_order() {
        let one = choices_digest(&["c", "a", "b"]);
        assert_eq!(one, choices_digest(&["a", "b", "c", "a"]));
        assert_eq!(
            one,
            choices_digest(&["b".to_owned(), "c".to_owned(), "a".to_owned()])
        );
        assert_ne!(one, choices_digest(&["a", "b"]));
        // hashlib.sha256("a\nb\nc".encode()).hexdigest()[:32]
        assert_eq!(one, "ea7fb08b7a2dc4619ffb7c7bb38d95a2");
    }
}

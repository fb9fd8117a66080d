//! The cache file's layout as both directions see it: the section names, the `Result.config`
//! that import writes ([`ImportedConfig`]) and export reads back ([`StoredConfig`]), the rank a
//! section stands for, and the record of what was left out ([`SkippedEntry`]).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The `Key.namespace` of every entry this module imports or exports.
pub const NAMESPACE: &str = "trtllm";

pub(crate) const METADATA_SECTION: &str = "metadata";
pub(crate) const SHARED_SECTION: &str = "shared";
pub(crate) const RANK_SECTION_PREFIX: &str = "rank_";

/// One file entry (or whole section) that import or export left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEntry {
    /// `"rank_3"`, `"shared"`, ...; for export, the section the entry would have gone to, if known.
    pub section: String,
    /// The key string; empty when a whole section was skipped.
    pub key: String,
    pub reason: String,
}

/// The `Result.config` of an imported entry, as [`import`](fn@crate::import) writes it and
/// [`export`](fn@crate::export) reads it.
/// The raw fields hold the file's own JSON text, so no value is re-formatted.
#[derive(Serialize)]
pub struct ImportedConfig<'a> {
    pub runner_id: &'a RawValue,
    pub tactic: &'a RawValue,
    pub min_time: &'a RawValue,
    /// `min_time`'s text again, as a string: whoever re-serializes the config as a plain JSON
    /// value may re-format the number (`1e-3` becomes `0.001`), but never a string.
    pub min_time_text: &'a str,
    /// The file's metadata object as text, so an export from the daemon can restore it; a string
    /// for the same reason as `min_time_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trtllm_metadata_json: Option<&'a str>,
}

/// What [`export`](fn@crate::export) reads back from a config; `min_time*` are absent in configs
/// recorded natively, and then `time_us / 1000` stands in.
#[derive(Deserialize)]
pub(crate) struct StoredConfig {
    pub(crate) runner_id: Box<RawValue>,
    pub(crate) tactic: Box<RawValue>,
    #[serde(default)]
    pub(crate) min_time: Option<Box<RawValue>>,
    #[serde(default)]
    pub(crate) min_time_text: Option<String>,
    #[serde(default)]
    pub(crate) trtllm_metadata_json: Option<String>,
}

/// `Some(rank)` inside: the section's `Key.rank`; `None` inside: the shared section.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SectionRank(pub(crate) Option<u32>);

/// The rank of a section name, `None` for a name that is not an entry section. Leading zeros are
/// refused, since export would write `rank_01` back as `rank_1`.
pub(crate) fn section_rank(section: &str) -> Option<SectionRank> {
    if section == SHARED_SECTION {
        return Some(SectionRank(None));
    }
    let digits = section.strip_prefix(RANK_SECTION_PREFIX)?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return None;
    }
    digits.parse().ok().map(|rank| SectionRank(Some(rank)))
}

//! The daemon library's one error type, and the one place its variants become gRPC status
//! codes. Binaries wrap it in `anyhow`; request handlers return it with `?`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::model::validate::InvalidField;

pub mod tier;
pub use tier::{TierError, TierResult};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("another tunecached is already serving on {}", .0.display())]
    AlreadyServing(PathBuf),

    #[error(
        "state directory {} belongs to another tunecached ({holder}); give each daemon its own \
         --state-dir",
        dir.display()
    )]
    StateDirInUse { dir: PathBuf, holder: String },

    #[error("{} exists and is not a socket; refusing to remove it", .0.display())]
    NotASocket(PathBuf),

    #[error("the journal writer has stopped")]
    WriterGone,

    /// A write the journal did not take; every Record in it is refused. Shared by the
    /// Records of one group commit, hence the `Arc`.
    #[error("journal write failed: {0}")]
    JournalWrite(#[source] Arc<Error>),

    /// The journal refuses appends until the writer rewrites it (repair).
    #[error("the journal is not writable, Records are refused until it is repaired: {reason}")]
    JournalUnwritable {
        reason: String,
        #[source]
        source: Option<Box<Error>>,
    },

    #[error(
        "the journal writer's queue is full (--write-queue-mib {limit_mib}): the disk is \
         slower than the callers; retry later"
    )]
    WriteQueueFull { limit_mib: u64 },

    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),

    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),

    // Deployment: socket activation, socket group, metrics endpoint.
    #[error("socket activation: {0}")]
    InheritedSocket(String),

    /// The default socket location is not private (squatted directory, symlink).
    #[error(transparent)]
    UntrustedSocket(#[from] tunecache_proto::socket_path::UntrustedSocket),

    #[error("group {0:?} does not exist (--socket-group / --allow-gid)")]
    UnknownGroup(String),

    #[error("--metrics-addr {0:?}: expected PORT (loopback) or HOST:PORT")]
    BadMetricsAddr(String),

    #[error("cluster tier: {0}")]
    ClusterConfig(String),

    #[error("no shared directory: start the daemon with --shared-dir")]
    NoSharedDir,

    #[error("shared directory unavailable: {0}")]
    SharedDirUnavailable(String),

    #[error("shared directory stuck: {operation} has not returned since unix ms {since_unix_ms}")]
    SharedDirStuck {
        operation: &'static str,
        since_unix_ms: i64,
    },

    #[error("shared directory did not finish {operation} within {waited:?}")]
    SharedDirTimeout {
        operation: &'static str,
        waited: std::time::Duration,
    },

    /// A bundle (`--bundle`) failed its check at start: the file, and the part and reason.
    #[error("bundle {}: {reason}", file.display())]
    BundleRefused { file: PathBuf, reason: String },

    #[error("--node-name: {0}")]
    InvalidNodeName(String),

    #[error("snapshot file skipped: {0}")]
    SnapshotFormat(String),

    /// A shared-directory file that does not prove who wrote it (no MAC, a MAC that does not
    /// verify, or an owner that is not an allowed writer).
    #[error("snapshot file skipped: {0}")]
    Unauthenticated(String),

    /// A file in a `v2/` that every user shares (root's, sticky, mode 1777) owned by a uid
    /// this daemon does not trust: another user's cache, skipped quietly.
    #[error("snapshot file skipped: owned by uid {0}, another user whose files this daemon does not trust")]
    OtherUsersFile(u32),

    /// A segment name this node was about to write exists already (another writer of the
    /// node's name).
    #[error("segment {0:?} exists already: another writer uses this node's name")]
    SegmentNameTaken(String),

    /// The shared directory's own layout is unsafe to use (a symlink, a foreign owner, a
    /// mode others can write); nothing is read from or written to it until that is fixed.
    #[error("{0}")]
    SharedDirUnsafe(String),

    // Refused requests.
    /// An administrator's act (a scope Forget, EndView, Prune) from a caller who is not one;
    /// `act` names it, and what the caller may do instead.
    #[error(
        "{act} is an administrator's act: uid {uid} is not an --admin-uid ({admins}) and in \
         no --admin-gid{instead}"
    )]
    NotAdmin {
        act: &'static str,
        instead: &'static str,
        uid: String,
        admins: String,
    },

    /// A request field failed validation; names the element and field.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),

    #[error(
        "pid {pid} already holds {limit} tuning leases (--max-leases-per-pid {limit}); \
         Record or give up one before resolving more"
    )]
    LeasesPerPid { pid: i32, limit: usize },

    /// The kernel recorded no credentials for the caller, so no access rule can admit it.
    #[error("tunecached cannot tell who the caller is (no peer credentials)")]
    UnknownCaller,

    /// The caller's uid and groups match none of `--allow-uid` / `--allow-gid`.
    #[error(
        "uid {uid} may not use this tunecached; ask its operator to add --allow-uid {uid} \
         or --allow-gid with one of your groups"
    )]
    CallerNotAllowed { uid: u32 },

    #[error("the node's tuner queue is full ({capacity} jobs); resolve again later")]
    TunerQueueFull { capacity: usize },

    /// Refused from its gRPC header, before any of the message was buffered.
    #[error(
        "request message of {len} bytes is over the daemon's limit (--max-message-bytes \
         {limit}); split the batch"
    )]
    MessageTooLarge { len: usize, limit: usize },

    /// Refused from its gRPC header: the caller's uid already has this many request bytes
    /// being read or served.
    #[error(
        "uid {uid} already has {in_flight} bytes of requests in flight; {len} more would pass \
         --max-request-bytes-per-uid {limit}: retry later"
    )]
    RequestBytesPerUid {
        uid: u32,
        in_flight: usize,
        len: usize,
        limit: usize,
    },

    /// The caller's uid asked more exact-key (`only_if`) Forgets this minute than its budget.
    #[error(
        "uid {uid} asked more than --max-exact-forgets-per-uid {limit} Forgets of one key \
         (only_if) this minute: retry later"
    )]
    ExactForgetsPerUid { uid: u32, limit: u32 },

    /// Request limit flags that cannot work together.
    #[error("{0}")]
    RequestLimits(String),

    /// One entry or tombstone too big for a journal frame of its own: never written, as
    /// replay would refuse the frame (the store keeps none this big: `MAX_RECORD_BYTES`).
    #[error(
        "a journal record of {len} bytes is over the largest frame ({limit} bytes); not written"
    )]
    JournalRecordTooLarge { len: usize, limit: usize },

    /// Re-decoding a response the daemon encoded itself failed.
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
}

impl Error {
    /// Builds an `Io` error that names what was being done and to which path.
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }

    /// The gRPC code a caller sees for this error. Retryable conditions (the journal, the
    /// shared directory) are UNAVAILABLE; refusals for load are RESOURCE_EXHAUSTED.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::InvalidField(_) => Code::InvalidArgument,
            Error::WriteQueueFull { .. }
            | Error::LeasesPerPid { .. }
            | Error::TunerQueueFull { .. }
            | Error::MessageTooLarge { .. }
            | Error::RequestBytesPerUid { .. }
            | Error::ExactForgetsPerUid { .. } => Code::ResourceExhausted,
            Error::WriterGone
            | Error::JournalWrite(_)
            | Error::JournalUnwritable { .. }
            | Error::SharedDirUnavailable(_)
            | Error::SharedDirUnsafe(_)
            | Error::SharedDirStuck { .. } => Code::Unavailable,
            Error::UnknownCaller | Error::CallerNotAllowed { .. } | Error::NotAdmin { .. } => {
                Code::PermissionDenied
            }
            Error::NoSharedDir => Code::FailedPrecondition,
            Error::SharedDirTimeout { .. } => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    /// A refused field also travels as the standard `google.rpc.BadRequest` detail, with the
    /// field's path (`entries[7].key.problem`): clients find the refused entry there, not by
    /// reading the message, which stays as it is for people. A message refused for its size
    /// travels with a `google.rpc.ErrorInfo` (reason `MESSAGE_TOO_LARGE`, the flag, the limit and
    /// the size) and a `google.rpc.QuotaFailure` whose subject is the flag: clients split the
    /// batch on that reason, never on the message's text.
    fn from(error: Error) -> Self {
        use tonic_types::{ErrorDetails, StatusExt};
        match &error {
            Error::InvalidField(field) => tonic::Status::with_error_details(
                error.code(),
                error.to_string(),
                ErrorDetails::with_bad_request_violation(field.path.clone(), field.reason.clone()),
            ),
            Error::MessageTooLarge { len, limit } => tonic::Status::with_error_details(
                error.code(),
                error.to_string(),
                message_too_large_details(*len, *limit),
            ),
            _ => tonic::Status::new(error.code(), error.to_string()),
        }
    }
}

/// The structured details of a request refused for its size (see `From<Error> for Status`).
fn message_too_large_details(len: usize, limit: usize) -> tonic_types::ErrorDetails {
    use tunecache_proto::limits::{
        ERROR_DOMAIN, FLAG_KEY, LIMIT_BYTES_KEY, MAX_MESSAGE_BYTES_FLAG, MESSAGE_BYTES_KEY,
        MESSAGE_TOO_LARGE_REASON,
    };
    let metadata = std::collections::HashMap::from([
        (FLAG_KEY.to_owned(), MAX_MESSAGE_BYTES_FLAG.to_owned()),
        (LIMIT_BYTES_KEY.to_owned(), limit.to_string()),
        (MESSAGE_BYTES_KEY.to_owned(), len.to_string()),
    ]);
    let mut details = tonic_types::ErrorDetails::with_error_info(
        MESSAGE_TOO_LARGE_REASON,
        ERROR_DOMAIN,
        metadata,
    );
    details.add_quota_failure_violation(
        MAX_MESSAGE_BYTES_FLAG,
        format!("a request message of {len} bytes; the limit is {limit}"),
    );
    details
}

/// Lets handlers use `?` on validation results; the code comes from `Error::code`.
impl From<InvalidField> for tonic::Status {
    fn from(error: InvalidField) -> Self {
        Error::from(error).into()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn status(error: Error) -> (Code, String) {
        let status = tonic::Status::from(error);
        (status.code(), status.message().to_owned())
    }

    #[test]
    fn request_errors_keep_their_codes_and_messages() {
        let invalid = InvalidField {
            path: "entries[1].key.op".into(),
            reason: "must not be empty".into(),
        };
        assert_eq!(
            status(invalid.clone().into()),
            (
                Code::InvalidArgument,
                "entries[1].key.op: must not be empty".into()
            )
        );
        let with_details = tonic::Status::from(invalid);
        assert_eq!(with_details.code(), Code::InvalidArgument);
        let violations = tonic_types::StatusExt::get_details_bad_request(&with_details)
            .expect("a BadRequest detail")
            .field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(
            (
                violations[0].field.as_str(),
                violations[0].description.as_str()
            ),
            ("entries[1].key.op", "must not be empty")
        );
        assert_eq!(
            status(Error::LeasesPerPid { pid: 7, limit: 2 }),
            (
                Code::ResourceExhausted,
                "pid 7 already holds 2 tuning leases (--max-leases-per-pid 2); Record or give \
                 up one before resolving more"
                    .into()
            )
        );
        assert_eq!(
            status(Error::TunerQueueFull { capacity: 4 }),
            (
                Code::ResourceExhausted,
                "the node's tuner queue is full (4 jobs); resolve again later".into()
            )
        );
        assert_eq!(
            status(Error::CallerNotAllowed { uid: 1234 }),
            (
                Code::PermissionDenied,
                "uid 1234 may not use this tunecached; ask its operator to add --allow-uid 1234 \
                 or --allow-gid with one of your groups"
                    .into()
            )
        );
        assert_eq!(
            status(Error::UnknownCaller),
            (
                Code::PermissionDenied,
                "tunecached cannot tell who the caller is (no peer credentials)".into()
            )
        );
        assert_eq!(
            status(Error::MessageTooLarge {
                len: 70_000_000,
                limit: 67_108_864
            }),
            (
                Code::ResourceExhausted,
                "request message of 70000000 bytes is over the daemon's limit \
                 (--max-message-bytes 67108864); split the batch"
                    .into()
            )
        );
        assert_eq!(
            status(Error::RequestBytesPerUid {
                uid: 1000,
                in_flight: 200,
                len: 100,
                limit: 256
            }),
            (
                Code::ResourceExhausted,
                "uid 1000 already has 200 bytes of requests in flight; 100 more would pass \
                 --max-request-bytes-per-uid 256: retry later"
                    .into()
            )
        );
        assert_eq!(status(Error::WriterGone).0, Code::Unavailable);
        assert_eq!(status(Error::NoSharedDir).0, Code::FailedPrecondition);
        assert_eq!(status(Error::AlreadyServing("/s".into())).0, Code::Internal);
    }

    #[test]
    fn a_size_refusal_names_its_flag_in_structured_details() {
        use tonic_types::StatusExt;
        use tunecache_proto::limits::{ERROR_DOMAIN, MAX_MESSAGE_BYTES_FLAG};
        let status = tonic::Status::from(Error::MessageTooLarge {
            len: 70_000,
            limit: 65_536,
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        // The message stays for people.
        assert!(status.message().contains("--max-message-bytes 65536"));
        let info = status
            .get_details_error_info()
            .expect("an ErrorInfo detail");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("MESSAGE_TOO_LARGE", ERROR_DOMAIN)
        );
        assert_eq!(info.metadata["flag"], MAX_MESSAGE_BYTES_FLAG);
        assert_eq!(info.metadata["limit_bytes"], "65536");
        assert_eq!(info.metadata["message_bytes"], "70000");
        let quota = status
            .get_details_quota_failure()
            .expect("a QuotaFailure detail");
        assert_eq!(quota.violations.len(), 1);
        assert_eq!(quota.violations[0].subject, MAX_MESSAGE_BYTES_FLAG);
        // The other load refusals carry no such detail: only a smaller message helps here.
        let per_uid = tonic::Status::from(Error::RequestBytesPerUid {
            uid: 1,
            in_flight: 1,
            len: 1,
            limit: 1,
        });
        assert!(per_uid.get_details_error_info().is_none());
    }

    #[test]
    fn a_journal_write_failure_keeps_its_cause() {
        use std::error::Error as _;
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let cause = Error::io("appending to journal", "/state/journal", io);
        let error = Error::JournalWrite(Arc::new(cause));
        assert_eq!(error.code(), Code::Unavailable);
        let message = error.to_string();
        assert!(
            message.starts_with("journal write failed: appending to journal /state/journal: "),
            "{message}"
        );
        let io = error
            .source()
            .and_then(|cause| cause.source())
            .and_then(|io| io.downcast_ref::<std::io::Error>())
            .expect("the io::Error is kept as the source");
        assert_eq!(io.raw_os_error(), Some(libc::ENOSPC));
    }
}

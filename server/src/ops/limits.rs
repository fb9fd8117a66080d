//! What the daemon allows callers to hold, and what it reports when a limit is hit: the
//! NOFILE raise at start-up and the per-limit counters Stats and metrics report (each hit is
//! logged once per cause, `report::LogOnce`).
//!
//! Each limit lives where its resource does (connections in `incoming`, leases in `coord`,
//! the writer queue in `store`); this module owns what they share.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::report::LogOnce;

/// The file-descriptor limit the daemon runs under, after `raise_nofile_limit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NofileLimit {
    pub soft: u64,
    pub hard: u64,
}

fn get_nofile() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

/// Raises the soft NOFILE limit to the hard limit (every connection and every lease's
/// pidfd is a descriptor; the usual soft default of 1,024 is far below what a busy node
/// needs) and logs both. A failure is logged and the daemon runs with what it has.
pub fn raise_nofile_limit() -> NofileLimit {
    let mut limit = match get_nofile() {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return NofileLimit::default();
        }
    };
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit we own; raising soft up to hard needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            let error = std::io::Error::last_os_error();
            tracing::warn!(%error, soft = before, hard = limit.rlim_max, "cannot raise the open-file soft limit to the hard limit");
        }
    }
    let nofile = NofileLimit {
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    };
    tracing::info!(
        soft = nofile.soft,
        hard = nofile.hard,
        soft_at_start = before,
        "open-file limit (RLIMIT_NOFILE); raise the hard limit with LimitNOFILE= or ulimit -Hn"
    );
    nofile
}

crate::report::stats_registry! {
    /// Counts of the connection limits hit, and the connections open now; reported by Stats.
    #[derive(Default)]
    pub struct ConnectionCounters {
        /// Failed accept(2) calls (out of descriptors, typically); each is followed by a
        /// back-off.
        pub accept_errors: AtomicU64 => counter(
            30,
            "Failed accepts (out of descriptors, typically), each followed by a back-off.",
        ),
        /// Connections closed because their uid already held `--max-connections-per-uid`.
        pub refused_per_uid: AtomicU64 as connections_refused_per_uid
            => counter(31, "Connections closed at accept: the uid held --max-connections-per-uid."),
        /// Connections closed because they sent no HTTP/2 preface within `--preface-timeout`.
        pub preface_timeouts: AtomicU64 => counter(
            32,
            "Connections closed for sending no HTTP/2 preface within --preface-timeout.",
        ),
        /// Connections open right now.
        pub open: AtomicU64 as connections_open => gauge(38, "Client connections open."),
    }
}

/// The connection limits in force, what they hit, and which causes were logged. One per
/// daemon, shared by the accept loop, every connection and Stats.
pub struct ConnectionLimits {
    pub nofile: NofileLimit,
    pub max_per_uid: usize,
    pub preface_timeout: Duration,
    pub counters: ConnectionCounters,
    pub logged: LogOnce,
}

impl ConnectionLimits {
    pub fn new(nofile: NofileLimit, max_per_uid: usize, preface_timeout: Duration) -> Self {
        ConnectionLimits {
            nofile,
            max_per_uid,
            preface_timeout,
            counters: ConnectionCounters::default(),
            logged: LogOnce::default(),
        }
    }
}

crate::report::stats_registry! {
    /// The connection fields of Stats.
    impl FillStats for ConnectionLimits {
        fn fill_stats(limits, stats) {}
        include ConnectionCounters = limits.counters;
        fields {
            nofile_soft_limit = limits.nofile.soft
                => gauge(41, "Open-file limit the daemon runs under."),
            nofile_hard_limit = limits.nofile.hard => not_exported,
            max_connections_per_uid = limits.max_per_uid as u64 => not_exported,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_logged_once() {
        let log = LogOnce::default();
        assert!(log.first("uid 1000"));
        assert!(!log.first("uid 1000"));
        assert!(log.first("uid 1001"));
    }

    #[test]
    fn raising_leaves_soft_at_hard() {
        let nofile = raise_nofile_limit();
        assert_eq!(nofile.soft, nofile.hard);
        let now = get_nofile().unwrap();
        assert_eq!(now.rlim_cur, now.rlim_max);
    }
}

//! The clock of every `*_unix_ms` field (`tuned_at_unix_ms`, snapshot times), so the daemon,
//! the worker and the clients stamp times the same way.

use std::time::{SystemTime, UNIX_EPOCH};

/// `time` in milliseconds since the Unix epoch: 0 before 1970, `i64::MAX` past year 292 million.
pub fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| {
        i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
    })
}

/// Now, in milliseconds since the Unix epoch (see [`unix_ms`]).
pub fn unix_now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn before_the_epoch_is_zero_and_after_is_milliseconds() {
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1234)), 1234);
        assert!(unix_now_ms() > 1_600_000_000_000);
    }
}

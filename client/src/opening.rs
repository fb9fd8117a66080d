//! What a client does while the daemon is opening: a daemon replaying its journal answers
//! every call UNAVAILABLE with a RetryInfo detail ("replaying the journal: N of M frames"),
//! and the client asks again after the delay it names, within the call's own deadline; any
//! other answer, and that one once the deadline would pass, goes to the caller as it came.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Status};
use tonic_types::StatusExt;

/// The delay a daemon that is not open yet asks for; `None` for any other answer.
pub fn retry_after(status: &Status) -> Option<Duration> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    status.get_details_retry_info()?.retry_delay
}

/// Calls `call` with a request of `message` carrying what is left of `timeout`, again after
/// each answer that the daemon is not open yet, until another answer comes or the next try
/// would start past the deadline.
pub async fn call<T, R, F, Fut>(message: T, timeout: Duration, mut call: F) -> Result<R, Status>
where
    T: Clone,
    F: FnMut(Request<T>) -> Fut,
    Fut: Future<Output = Result<R, Status>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let mut request = Request::new(message.clone());
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match call(request).await {
            Err(status) => match retry_after(&status) {
                Some(wait) if Instant::now() + wait < deadline => tokio::time::sleep(wait).await,
                _ => return Err(status),
            },
            answered => return answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn opening() -> Status {
        Status::with_error_details(
            tonic::Code::Unavailable,
            "replaying the journal: 1 of 2 frames",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(100))),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn asks_again_while_the_daemon_opens_then_takes_its_answer() {
        let mut tries = 0;
        let answer = call((), Duration::from_secs(5), |_| {
            tries += 1;
            let answer = if tries < 3 { Err(opening()) } else { Ok(tries) };
            async move { answer }
        })
        .await;
        assert_eq!(answer.ok(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_the_daemons_answer_once_the_deadline_would_pass() {
        let started = Instant::now();
        let answer: Result<(), Status> =
            call((), Duration::from_secs(1), |_| async { Err(opening()) }).await;
        let status = answer.expect_err("never opened");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().starts_with("replaying the journal"));
        assert!(started.elapsed() <= Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn another_unavailable_is_not_asked_again() {
        let mut tries = 0;
        let _ = call((), Duration::from_secs(5), |_| {
            tries += 1;
            async { Err::<(), _>(Status::unavailable("socket gone")) }
        })
        .await;
        assert_eq!(tries, 1);
    }
}

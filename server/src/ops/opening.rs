//! What TuneCache answers before the daemon is open: the socket is bound (by the daemon, or
//! by systemd under socket activation) before the journal is replayed, and a caller
//! meanwhile gets UNAVAILABLE at once, with how far the replay has got and a RetryInfo
//! detail, instead of a connection nobody answers. `Opening` stands where the service will;
//! `OpenDoor::open` puts the service in place once the daemon is built.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};
use tower::ServiceExt;

/// How long a caller is told to wait before it asks again.
pub const RETRY_AFTER: Duration = Duration::from_millis(100);

/// What the daemon is doing while it opens, asked at each call (the journal's replay
/// progress: ops knows no journal).
pub type Doing = Arc<dyn Fn() -> String + Send + Sync>;

/// The answer to a call before the daemon is open.
pub fn not_open_yet(doing: &str) -> Status {
    Status::with_error_details(
        tonic::Code::Unavailable,
        doing,
        ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
    )
}

/// The service's place until it is open.
pub struct Opening<S> {
    service: Arc<OnceLock<S>>,
    doing: Doing,
}

impl<S> Clone for Opening<S> {
    fn clone(&self) -> Self {
        Opening {
            service: Arc::clone(&self.service),
            doing: Arc::clone(&self.doing),
        }
    }
}

/// Opens an `Opening`: once, with the service every call then reaches.
pub struct OpenDoor<S> {
    service: Arc<OnceLock<S>>,
}

impl<S> OpenDoor<S> {
    /// From now on every call reaches `service`.
    pub fn open(self, service: S) {
        // This handle is the only one that sets it, and `open` takes it by value.
        let _ = self.service.set(service);
    }
}

/// A closed door and the handle that opens it; closed, calls are answered with what `doing`
/// says.
pub fn closed<S>(doing: Doing) -> (Opening<S>, OpenDoor<S>) {
    let service = Arc::new(OnceLock::new());
    (
        Opening {
            service: Arc::clone(&service),
            doing,
        },
        OpenDoor { service },
    )
}

type OpeningFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Opening<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = OpeningFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The service, once open, is readied per call below.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.service.get() {
            Some(service) => Box::pin(service.clone().oneshot(request)),
            None => {
                let status = not_open_yet(&(self.doing)());
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

impl<S: NamedService> NamedService for Opening<S> {
    const NAME: &'static str = S::NAME;
}

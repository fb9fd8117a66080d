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

use crate::journal::ReplayProgress;

/// How long a caller is told to wait before it asks again.
pub const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The answer to a call before the daemon is open.
pub fn replaying(progress: &ReplayProgress) -> Status {
    Status::with_error_details(
        tonic::Code::Unavailable,
        progress.describe(),
        ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
    )
}

/// The service's place until it is open.
pub struct Opening<S> {
    service: Arc<OnceLock<S>>,
    progress: Arc<ReplayProgress>,
}

impl<S> Clone for Opening<S> {
    fn clone(&self) -> Self {
        Opening {
            service: Arc::clone(&self.service),
            progress: Arc::clone(&self.progress),
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

/// A closed door and the handle that opens it; closed, calls are answered with `progress`.
pub fn closed<S>(progress: Arc<ReplayProgress>) -> (Opening<S>, OpenDoor<S>) {
    let service = Arc::new(OnceLock::new());
    (
        Opening {
            service: Arc::clone(&service),
            progress,
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
                let status = replaying(&self.progress);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

impl<S: NamedService> NamedService for Opening<S> {
    const NAME: &'static str = S::NAME;
}

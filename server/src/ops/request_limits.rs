//! The limits on what a TuneCache request may make the daemon hold, enforced while it is read:
//!
//! * its size: a message over `--max-message-bytes` is refused from its five-byte gRPC header,
//!   before any of it is buffered (tonic would read the whole message first, then check);
//! * the bytes in flight per caller: every request message holds its length against its uid's
//!   `--max-request-bytes-per-uid` from its header until its answer is ready (the bytes are
//!   buffered, decoded and served in that time); one that does not fit is refused at once;
//! * its entry count: decoding stops at entry `MAX_BATCH + 1` (`validate::check_count`, the
//!   Lookup and Record routes' decoders).
//!
//! Refusals are RESOURCE_EXHAUSTED naming the flag, counted in Stats
//! (`requests_refused_too_large`, `requests_refused_per_uid`) and logged once per cause.
//!
//! A request over the per-uid bound is refused rather than made to wait: a waiting request
//! stops reading its stream, whose unread bytes then hold the connection's HTTP/2 window, so
//! requests on the same connection that already hold bytes could never finish and free them.
//! The per-uid bound is several maximal messages, so one caller's flood is refused while the
//! uid's other requests are served (and other uids never see it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use prost::bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codegen::{http, StdError};
use tonic::server::NamedService;
use tonic::Status;
use tunecache_proto::limits::GRPC_FRAME_HEADER_BYTES;

use crate::error::Error;
use crate::report::LogOnce;

/// What one request may hold, what is held now, and what was refused. One per daemon.
pub struct RequestLimits {
    max_message_bytes: usize,
    max_bytes_per_uid: usize,
    /// The request bytes each uid holds now, as permits taken from its semaphore; a uid is
    /// removed when it holds none.
    per_uid: Mutex<HashMap<u32, Arc<Semaphore>>>,
    counters: RequestCounters,
    logged: LogOnce,
}

crate::report::stats_registry! {
    /// The request bytes held now, and the requests refused.
    #[derive(Default)]
    struct RequestCounters {
        /// Bytes of request messages being read, decoded or served now, all uids.
        in_flight: AtomicU64 as request_bytes_in_flight
            => gauge(40, "Bytes of request messages being read, decoded or served."),
        /// Requests over `--max-message-bytes`.
        refused_too_large: AtomicU64 as requests_refused_too_large
            => counter(36, "Requests refused from their header: over --max-message-bytes."),
        /// Requests whose uid had `--max-request-bytes-per-uid` in flight.
        refused_per_uid: AtomicU64 as requests_refused_per_uid => counter(
            37,
            "Requests refused from their header: the uid had --max-request-bytes-per-uid in flight.",
        ),
    }
}

impl RequestLimits {
    /// Checks that the limits can work together: a uid must be able to hold one message of
    /// the largest size.
    pub fn new(max_message_bytes: usize, max_bytes_per_uid: usize) -> Result<Self, Error> {
        if max_bytes_per_uid < max_message_bytes {
            return Err(Error::RequestLimits(format!(
                "--max-request-bytes-per-uid {max_bytes_per_uid} is below --max-message-bytes \
                 {max_message_bytes}: no uid could send a message of the largest size"
            )));
        }
        if max_bytes_per_uid > Semaphore::MAX_PERMITS {
            return Err(Error::RequestLimits(format!(
                "--max-request-bytes-per-uid {max_bytes_per_uid} is over {}",
                Semaphore::MAX_PERMITS
            )));
        }
        Ok(RequestLimits {
            max_message_bytes,
            max_bytes_per_uid,
            per_uid: Mutex::default(),
            counters: RequestCounters::default(),
            logged: LogOnce::default(),
        })
    }

    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Logs every request limit (called once, at start).
    pub fn log(&self) {
        use tunecache_proto::limits::{MAX_CONFIG_BYTES, MAX_ENTRIES, MAX_KEY_FIELD_BYTES};
        tracing::info!(
            max_message_bytes = self.max_message_bytes,
            max_request_bytes_per_uid = self.max_bytes_per_uid,
            max_entries = MAX_ENTRIES,
            max_key_field_bytes = MAX_KEY_FIELD_BYTES,
            max_config_bytes = MAX_CONFIG_BYTES,
            max_response_bytes = tunecache_proto::limits::MAX_MESSAGE_BYTES,
            "request limits: a larger message is refused from its header \
             (--max-message-bytes), a uid's requests in flight are bounded \
             (--max-request-bytes-per-uid), decoding stops at entry max_entries + 1"
        );
    }

    /// Admits a request message of `len` bytes from `uid`, or says why not.
    fn admit(self: &Arc<Self>, uid: Option<u32>, len: usize) -> Result<Grant, Error> {
        if len > self.max_message_bytes {
            self.counters
                .refused_too_large
                .fetch_add(1, Ordering::Relaxed);
            if self.logged.first("message too large") {
                tracing::warn!(
                    uid,
                    bytes = len,
                    limit = self.max_message_bytes,
                    "refused a request message over --max-message-bytes from its header \
                     (logged once; Stats counts each as requests_refused_too_large)"
                );
            }
            return Err(Error::MessageTooLarge {
                len,
                limit: self.max_message_bytes,
            });
        }
        // Without credentials the peer check has refused the call already; count it anyway.
        let permit = match uid {
            Some(uid) => Some(self.take_per_uid(uid, len)?),
            None => None,
        };
        self.counters
            .in_flight
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(Grant {
            limits: self.clone(),
            uid,
            permit,
            len,
        })
    }

    fn take_per_uid(&self, uid: u32, len: usize) -> Result<OwnedSemaphorePermit, Error> {
        let mut per_uid = crate::sync::lock(&self.per_uid);
        let semaphore = per_uid
            .entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(self.max_bytes_per_uid)));
        let available = semaphore.available_permits();
        // `len` fits in u32: it is no larger than a gRPC length.
        if let Ok(permit) = semaphore.clone().try_acquire_many_owned(len as u32) {
            return Ok(permit);
        }
        drop(per_uid);
        self.counters
            .refused_per_uid
            .fetch_add(1, Ordering::Relaxed);
        let in_flight = self.max_bytes_per_uid - available;
        if self.logged.first(format!("request bytes of uid {uid}")) {
            tracing::warn!(
                uid,
                bytes = len,
                in_flight,
                limit = self.max_bytes_per_uid,
                "refused a request: its uid already has --max-request-bytes-per-uid in \
                 flight (logged once per uid; Stats counts each as requests_refused_per_uid)"
            );
        }
        Err(Error::RequestBytesPerUid {
            uid,
            in_flight,
            len,
            limit: self.max_bytes_per_uid,
        })
    }
}

crate::report::stats_registry! {
    /// The request fields of Stats.
    impl FillStats for RequestLimits {
        fn fill_stats(limits, stats) {}
        include RequestCounters = limits.counters;
        fields {
            max_message_bytes = limits.max_message_bytes as u64 => not_exported,
            max_request_bytes_per_uid = limits.max_bytes_per_uid as u64 => not_exported,
        }
    }
}

/// One request message's bytes, held against its uid until dropped.
struct Grant {
    limits: Arc<RequestLimits>,
    uid: Option<u32>,
    permit: Option<OwnedSemaphorePermit>,
    len: usize,
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.limits
            .counters
            .in_flight
            .fetch_sub(self.len as u64, Ordering::Relaxed);
        let (Some(uid), Some(permit)) = (self.uid, self.permit.take()) else {
            return;
        };
        let mut per_uid = crate::sync::lock(&self.limits.per_uid);
        drop(permit);
        if per_uid
            .get(&uid)
            .is_some_and(|s| s.available_permits() == self.limits.max_bytes_per_uid)
        {
            per_uid.remove(&uid);
        }
    }
}

/// Client-streaming methods: each message is decoded and handled before the next is read.
const STREAMING_REQUEST_PATHS: &[&str] = &["/tunecache.v1.TuneCache/PutArtifact"];

/// The grants of one call, shared by its request body (which takes them as headers arrive)
/// and its response future (which keeps them until the answer is ready).
type CallGrants = Arc<Mutex<Vec<Grant>>>;

/// Wraps a gRPC service so that each call's request messages pass the limits as they are read.
#[derive(Clone)]
pub struct Limited<S> {
    inner: S,
    limits: Arc<RequestLimits>,
}

impl<S> Limited<S> {
    pub fn new(inner: S, limits: Arc<RequestLimits>) -> Self {
        Limited { inner, limits }
    }
}

impl<S: NamedService> NamedService for Limited<S> {
    const NAME: &'static str = S::NAME;
}

type LimitedFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Limited<S>
where
    S: tower::Service<http::Request<LimitedBody<B>>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = LimitedFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let uid = request
            .extensions()
            .get::<crate::ops::access::PeerInfo>()
            .and_then(crate::ops::access::PeerInfo::uid);
        let grants = CallGrants::default();
        let body_grants = grants.clone();
        let limits = self.limits.clone();
        let streaming = STREAMING_REQUEST_PATHS.contains(&request.uri().path());
        let request = request.map(|body| LimitedBody {
            inner: body,
            limits,
            uid,
            grants: body_grants,
            streaming,
            header: [0; GRPC_FRAME_HEADER_BYTES],
            header_read: 0,
            body_left: 0,
        });
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await;
            // The message was decoded and served: its bytes are free again.
            drop(grants);
            response
        })
    }
}

/// A request body that reads each gRPC message's header as it passes and admits the message
/// (`RequestLimits::admit`) before handing on any of it; a refusal ends the body with the
/// refusal's status, which tonic answers.
pub struct LimitedBody<B> {
    inner: B,
    limits: Arc<RequestLimits>,
    uid: Option<u32>,
    grants: CallGrants,
    /// A client-streaming call: a message's bytes are free once the next one's header
    /// arrives (the handler has taken it), not at the answer, so a long upload holds one
    /// chunk against its uid, never the whole blob.
    streaming: bool,
    /// The current message's header, while it is read.
    header: [u8; GRPC_FRAME_HEADER_BYTES],
    header_read: usize,
    /// Bytes of the current message still to pass, once its header is read.
    body_left: usize,
}

impl<B> LimitedBody<B> {
    /// Follows the gRPC framing through `data`, admitting each message whose header ends in it.
    fn observe(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            if self.body_left > 0 {
                let skip = self.body_left.min(data.len());
                self.body_left -= skip;
                data = &data[skip..];
                continue;
            }
            let take = (GRPC_FRAME_HEADER_BYTES - self.header_read).min(data.len());
            self.header[self.header_read..self.header_read + take].copy_from_slice(&data[..take]);
            self.header_read += take;
            data = &data[take..];
            if self.header_read < GRPC_FRAME_HEADER_BYTES {
                break;
            }
            self.header_read = 0;
            let [_, length @ ..] = self.header;
            let len = u32::from_be_bytes(length) as usize;
            let grant = self.limits.admit(self.uid, len)?;
            let mut grants = crate::sync::lock(&self.grants);
            if self.streaming {
                grants.clear();
            }
            grants.push(grant);
            self.body_left = len;
        }
        Ok(())
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = &mut *self;
        match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(refusal) = this.observe(data) {
                        return Poll::Ready(Some(Err(Box::new(Status::from(refusal)))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(error.into()))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunecache_proto::v1;

    fn limits(max_message: usize, per_uid: usize) -> Arc<RequestLimits> {
        Arc::new(RequestLimits::new(max_message, per_uid).unwrap())
    }

    fn body(limits: &Arc<RequestLimits>, uid: u32) -> LimitedBody<()> {
        LimitedBody {
            inner: (),
            limits: limits.clone(),
            uid: Some(uid),
            grants: CallGrants::default(),
            streaming: false,
            header: [0; GRPC_FRAME_HEADER_BYTES],
            header_read: 0,
            body_left: 0,
        }
    }

    #[test]
    fn a_streaming_upload_holds_one_message_against_its_uid_not_the_whole_stream() {
        let limits = limits(100, 250);
        let mut upload = body(&limits, 1);
        upload.streaming = true;
        for _ in 0..10 {
            upload.observe(&framed(100)).unwrap();
            assert_eq!(stats(&limits).request_bytes_in_flight, 100);
        }
        assert_eq!(stats(&limits).requests_refused_per_uid, 0);
        // The same ten messages on a unary-style call would pass the bound at the third.
        let mut unary = body(&limits, 2);
        unary.observe(&framed(100)).unwrap();
        unary.observe(&framed(100)).unwrap();
        assert!(unary.observe(&framed(100)).is_err());
        assert!(STREAMING_REQUEST_PATHS.contains(&"/tunecache.v1.TuneCache/PutArtifact"));
    }

    fn framed(len: usize) -> Vec<u8> {
        let mut message = vec![0];
        message.extend_from_slice(&(len as u32).to_be_bytes());
        message.resize(GRPC_FRAME_HEADER_BYTES + len, 7);
        message
    }

    fn stats(limits: &RequestLimits) -> v1::StatsResponse {
        let mut stats = v1::StatsResponse::default();
        crate::report::FillStats::fill_stats(limits, &mut stats);
        stats
    }

    #[test]
    fn limits_that_cannot_work_together_are_refused() {
        assert!(RequestLimits::new(100, 99).is_err());
        assert!(RequestLimits::new(100, 100).is_ok());
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_header() {
        let limits = limits(100, 1000);
        let mut over = body(&limits, 1);
        let error = over.observe(&framed(101)[..5]).unwrap_err();
        assert!(matches!(
            error,
            Error::MessageTooLarge {
                len: 101,
                limit: 100
            }
        ));
        assert_eq!(stats(&limits).requests_refused_too_large, 1);
        assert_eq!(stats(&limits).request_bytes_in_flight, 0);

        let mut at_limit = body(&limits, 1);
        at_limit.observe(&framed(100)).unwrap();
        assert_eq!(stats(&limits).request_bytes_in_flight, 100);
        drop(at_limit);
        assert_eq!(stats(&limits).request_bytes_in_flight, 0);
    }

    #[test]
    fn headers_split_across_frames_are_read_whole() {
        let limits = limits(1000, 1000);
        let mut split = body(&limits, 1);
        let mut two = framed(300);
        two.extend_from_slice(&framed(200));
        for byte in two.chunks(1) {
            split.observe(byte).unwrap();
        }
        assert_eq!(stats(&limits).request_bytes_in_flight, 500);
        assert_eq!(crate::sync::lock(&split.grants).len(), 2);
        let mut chunks = body(&limits, 2);
        let three = [framed(0), framed(1), framed(2)].concat();
        chunks.observe(&three[..3]).unwrap();
        chunks.observe(&three[3..]).unwrap();
        assert_eq!(stats(&limits).request_bytes_in_flight, 503);
    }

    #[test]
    fn each_uid_holds_at_most_its_bound_and_gets_it_back() {
        let limits = limits(100, 250);
        let first = body(&limits, 1);
        let mut first = first;
        first.observe(&framed(100)).unwrap();
        let mut second = body(&limits, 1);
        second.observe(&framed(100)).unwrap();
        let mut third = body(&limits, 1);
        let error = third.observe(&framed(100)[..5]).unwrap_err();
        assert!(
            matches!(
                error,
                Error::RequestBytesPerUid {
                    uid: 1,
                    in_flight: 200,
                    len: 100,
                    limit: 250
                }
            ),
            "{error}"
        );
        // A smaller request of the same uid still fits; another uid is not affected.
        body(&limits, 1).observe(&framed(50)).unwrap();
        let mut other = body(&limits, 2);
        other.observe(&framed(100)).unwrap();
        assert_eq!(stats(&limits).requests_refused_per_uid, 1);
        assert_eq!(stats(&limits).request_bytes_in_flight, 300);
        drop(first);
        body(&limits, 1).observe(&framed(100)).unwrap();
        drop((second, other));
        assert_eq!(stats(&limits).request_bytes_in_flight, 0);
        assert!(crate::sync::lock(&limits.per_uid).is_empty());
    }
}

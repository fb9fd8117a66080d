//! The routes that serve Lookup, Record and Scan from their bytes, in front of the generated
//! `TuneCacheServer`, which answers every other method.
//!
//! [`WireRoutes`] answers these three itself: Lookup and Scan responses are written from the
//! entries' stored wire form (`wire`), and Lookup and Record requests stay bytes
//! ([`BytesCodec`]) until the service reads them within the entry limit
//! (`wire::lookup_request`, `wire::record_request`). One larger than
//! `off_runtime::OFF_RUNTIME_BYTES` is read and checked on the blocking pool, so that one
//! caller's large request never holds a runtime worker (and the other callers' calls queued
//! behind it) for its whole decode. The
//! generated service's own bodies of the three methods call the same functions
//! (`service`), so each RPC has one door.
//!
//! Every method that names a job view (Lookup, Scan, Resolve, EndView) is decoded here, not
//! by tonic's codec, so that a request that does not decode (a view name that is not UTF-8)
//! is the caller's INVALID_ARGUMENT naming the field (`decode_status`), not INTERNAL.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::bytes::{Buf, Bytes};
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tunecache_proto::v1;
use tunecache_proto::v1::tune_cache_server::TuneCache;

use crate::rpc::service::{EncodedScanStream, TuneCacheService};
use crate::wire::encoded::EncodedEntries;
use crate::wire::lookup_request::{decode_status, LookupRequestBytes};
use crate::wire::record_request::RecordRequestBytes;

const LOOKUP_PATH: &str = "/tunecache.v1.TuneCache/Lookup";
const RECORD_PATH: &str = "/tunecache.v1.TuneCache/Record";
const SCAN_PATH: &str = "/tunecache.v1.TuneCache/Scan";
const RESOLVE_PATH: &str = "/tunecache.v1.TuneCache/Resolve";
const END_VIEW_PATH: &str = "/tunecache.v1.TuneCache/EndView";

/// A route's codec that keeps the request message as bytes (`D` wraps them; no copy: the frame
/// is split off tonic's buffer) and encodes responses `E` as the generated route's prost codec
/// does.
pub struct BytesCodec<E, D>(PhantomData<fn() -> (E, D)>);

impl<E, D> Default for BytesCodec<E, D> {
    fn default() -> Self {
        BytesCodec(PhantomData)
    }
}

impl<E, D> Codec for BytesCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: From<Bytes> + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = tonic_prost::ProstEncoder<E>;
    type Decoder = BytesDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder(PhantomData)
    }
}

/// Takes the whole message as bytes.
pub struct BytesDecoder<D>(PhantomData<fn() -> D>);

impl<D: From<Bytes> + Send + 'static> Decoder for BytesDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        Ok(Some(D::from(buf.copy_to_bytes(buf.remaining()))))
    }
}

/// The generated `TuneCacheServer` with Lookup and Scan answered from the wire form, and
/// Lookup and Record read from the request's bytes.
#[derive(Clone)]
pub struct WireRoutes<S> {
    generated: S,
    service: Arc<TuneCacheService>,
    max_encoding_message_size: usize,
    max_decoding_message_size: usize,
}

impl<S> WireRoutes<S> {
    /// Requests of up to `max_request_bytes` are decoded, responses of up to
    /// `max_response_bytes` encoded.
    pub fn new(
        generated: S,
        service: Arc<TuneCacheService>,
        max_request_bytes: usize,
        max_response_bytes: usize,
    ) -> Self {
        WireRoutes {
            generated,
            service,
            max_encoding_message_size: max_response_bytes,
            max_decoding_message_size: max_request_bytes,
        }
    }
}

impl<S: NamedService> NamedService for WireRoutes<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for WireRoutes<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.generated.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (decode, encode) = (
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        match request.uri().path() {
            LOOKUP_PATH => {
                let method = LookupMethod(Arc::clone(&self.service));
                Box::pin(async move {
                    let codec = BytesCodec::<EncodedEntries, LookupRequestBytes>::default();
                    let mut grpc = tonic::server::Grpc::new(codec)
                        .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.unary(method, request).await)
                })
            }
            RECORD_PATH => {
                let method = RecordMethod(Arc::clone(&self.service));
                Box::pin(async move {
                    let codec = BytesCodec::<v1::RecordResponse, RecordRequestBytes>::default();
                    let mut grpc = tonic::server::Grpc::new(codec)
                        .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.unary(method, request).await)
                })
            }
            SCAN_PATH => {
                let method = ScanMethod(Arc::clone(&self.service));
                Box::pin(async move {
                    let codec = BytesCodec::<EncodedEntries, MessageBytes>::default();
                    let mut grpc = tonic::server::Grpc::new(codec)
                        .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.server_streaming(method, request).await)
                })
            }
            RESOLVE_PATH => {
                let method = Decoded::new(Arc::clone(&self.service), |service, request| {
                    Box::pin(async move { service.resolve(request).await })
                });
                Box::pin(async move {
                    let codec = BytesCodec::<v1::ResolveResponse, MessageBytes>::default();
                    let mut grpc = tonic::server::Grpc::new(codec)
                        .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.unary(method, request).await)
                })
            }
            END_VIEW_PATH => {
                let method = Decoded::new(Arc::clone(&self.service), |service, request| {
                    Box::pin(async move { service.end_view(request).await })
                });
                Box::pin(async move {
                    let codec = BytesCodec::<v1::EndViewResponse, MessageBytes>::default();
                    let mut grpc = tonic::server::Grpc::new(codec)
                        .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.unary(method, request).await)
                })
            }
            _ => Box::pin(self.generated.call(request)),
        }
    }
}

type MethodFuture<T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send>>;

struct LookupMethod(Arc<TuneCacheService>);

impl tonic::server::UnaryService<LookupRequestBytes> for LookupMethod {
    type Response = EncodedEntries;
    type Future = MethodFuture<EncodedEntries>;

    fn call(&mut self, request: Request<LookupRequestBytes>) -> Self::Future {
        let service = Arc::clone(&self.0);
        let uid = crate::rpc::service::caller_uid(&request);
        Box::pin(async move {
            Ok(Response::new(
                service.lookup(uid, request.into_inner().0).await?,
            ))
        })
    }
}

struct RecordMethod(Arc<TuneCacheService>);

impl tonic::server::UnaryService<RecordRequestBytes> for RecordMethod {
    type Response = v1::RecordResponse;
    type Future = MethodFuture<v1::RecordResponse>;

    fn call(&mut self, request: Request<RecordRequestBytes>) -> Self::Future {
        let service = Arc::clone(&self.0);
        let uid = crate::rpc::service::caller_uid(&request);
        Box::pin(async move {
            service
                .record_bytes(uid, request.into_inner().0)
                .await
                .map(Response::new)
        })
    }
}

struct ScanMethod(Arc<TuneCacheService>);

impl tonic::server::ServerStreamingService<MessageBytes> for ScanMethod {
    type Response = EncodedEntries;
    type ResponseStream = EncodedScanStream;
    type Future = MethodFuture<Self::ResponseStream>;

    fn call(&mut self, request: Request<MessageBytes>) -> Self::Future {
        let service = Arc::clone(&self.0);
        let uid = crate::rpc::service::caller_uid(&request);
        Box::pin(async move {
            let scan = v1::ScanRequest::decode(request.into_inner().0).map_err(decode_status)?;
            Ok(Response::new(service.scan_encoded(uid, scan)?))
        })
    }
}

/// A request message kept as bytes, for a route that decodes it itself (`decode_status`:
/// a message that does not decode is the caller's INVALID_ARGUMENT, naming the field).
#[derive(Debug, Clone)]
pub struct MessageBytes(pub Bytes);

impl From<Bytes> for MessageBytes {
    fn from(bytes: Bytes) -> Self {
        MessageBytes(bytes)
    }
}

type Handler<M, R> = fn(Arc<TuneCacheService>, Request<M>) -> MethodFuture<R>;

/// A unary method of the generated service, given its request decoded here (with the
/// call's metadata and extensions, the caller's credentials among them).
struct Decoded<M, R> {
    service: Arc<TuneCacheService>,
    handler: Handler<M, R>,
}

impl<M, R> Decoded<M, R> {
    fn new(service: Arc<TuneCacheService>, handler: Handler<M, R>) -> Self {
        Decoded { service, handler }
    }
}

impl<M, R> tonic::server::UnaryService<MessageBytes> for Decoded<M, R>
where
    M: prost::Message + Default + Send + 'static,
    R: Send + 'static,
{
    type Response = R;
    type Future = MethodFuture<R>;

    fn call(&mut self, request: Request<MessageBytes>) -> Self::Future {
        let (metadata, extensions, bytes) = request.into_parts();
        let message = match M::decode(bytes.0) {
            Ok(message) => message,
            Err(error) => {
                let refused = decode_status(error);
                return Box::pin(async move { Err(refused) });
            }
        };
        (self.handler)(
            Arc::clone(&self.service),
            Request::from_parts(metadata, extensions, message),
        )
    }
}

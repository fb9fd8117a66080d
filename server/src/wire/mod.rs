//! The wire form of cache entries and the Lookup and Scan routes that send it.
//!
//! A Lookup or Scan response is a list of `tunecache.v1.Entry` messages. Building it as prost
//! messages would cost six `String` clones per entry, then an encode pass over them. The store
//! keeps every entry already encoded (`stored`), so a response is those records copied into
//! one buffer; the tonic codec then copies that buffer out as the message body. The bytes are
//! exactly what prost writes for the same `Entry` (same field order, defaults skipped), so
//! grpcurl, grpcio and the Rust client see the unchanged `tunecache.v1` contract.
//!
//! [`WireRoutes`] wraps the generated `TuneCacheServer` and answers these two methods, and
//! Record, itself; every other method goes to the generated server. Lookup and Record requests
//! stay bytes ([`BytesCodec`]) until the service reads them within the entry limit
//! (`lookup_request`, `record_request`): a request of more entries than allowed is refused at
//! the first one over, before prost builds any. One larger than `OFF_RUNTIME_BYTES` is read
//! and checked on the blocking pool, so that one caller's large request never holds a runtime
//! worker (and the other callers' calls queued behind it) for its whole decode.

pub(crate) mod encoded;
pub(crate) mod lookup_request;
pub(crate) mod record_request;
pub(crate) mod stored;

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::bytes::{Buf, Bytes};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tunecache_proto::v1;

use crate::rpc::service::TuneCacheService;
use crate::wire::encoded::EncodedEntries;
use crate::wire::lookup_request::LookupRequestBytes;
use crate::wire::record_request::RecordRequestBytes;

const LOOKUP_PATH: &str = "/tunecache.v1.TuneCache/Lookup";
const RECORD_PATH: &str = "/tunecache.v1.TuneCache/Record";
const SCAN_PATH: &str = "/tunecache.v1.TuneCache/Scan";

/// Requests larger than this are read and checked on the blocking pool. A 10,000-key Lookup
/// of typical keys is about 1 MiB and 15 ms of decoding and validation.
pub const OFF_RUNTIME_BYTES: usize = 256 * 1024;

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

/// Runs `read` on the request's bytes: inline when small, else on the blocking pool.
async fn off_runtime_if_large<T: Send + 'static>(
    request: Bytes,
    read: impl FnOnce(&Bytes) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    if request.len() <= OFF_RUNTIME_BYTES {
        return read(&request);
    }
    tokio::task::spawn_blocking(move || read(&request))
        .await
        .map_err(|error| Status::internal(format!("reading the request failed: {error}")))?
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
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                        EncodedEntries,
                        v1::ScanRequest,
                    >::default())
                    .apply_max_message_size_config(Some(decode), Some(encode));
                    Ok(grpc.server_streaming(method, request).await)
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
        Box::pin(async move {
            let reader = Arc::clone(&service);
            let answer = off_runtime_if_large(request.into_inner().0, move |bytes| {
                reader.lookup_bytes(bytes)
            })
            .await?;
            Ok(Response::new(service.finish_lookup(answer).await))
        })
    }
}

struct RecordMethod(Arc<TuneCacheService>);

impl tonic::server::UnaryService<RecordRequestBytes> for RecordMethod {
    type Response = v1::RecordResponse;
    type Future = MethodFuture<v1::RecordResponse>;

    fn call(&mut self, request: Request<RecordRequestBytes>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move {
            let record =
                off_runtime_if_large(request.into_inner().0, crate::wire::record_request::checked)
                    .await?;
            service.record_checked(record).await.map(Response::new)
        })
    }
}

struct ScanMethod(Arc<TuneCacheService>);

impl tonic::server::ServerStreamingService<v1::ScanRequest> for ScanMethod {
    type Response = EncodedEntries;
    type ResponseStream = crate::rpc::service::EncodedScanStream;
    type Future = MethodFuture<Self::ResponseStream>;

    fn call(&mut self, request: Request<v1::ScanRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { Ok(Response::new(service.scan_encoded(request)?)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::wire::stored::StoredEntry;
    use prost::Message;

    fn key(namespace: &str, problem: &str, rank: Option<u32>) -> CacheKey {
        CacheKey {
            namespace: namespace.into(),
            op: "gemm".into(),
            device: "NVIDIA H200|sm_90".into(),
            problem: problem.into(),
            rank,
        }
    }

    fn result(config: &str, time_us: f64, tuned_at: i64) -> TunedResult {
        TunedResult {
            config: config.into(),
            time_us,
            tuned_by: "node-a/rank-3".into(),
            tuned_at_unix_ms: tuned_at,
            forget_epoch: 0,
        }
    }

    #[test]
    fn encoded_entries_are_the_bytes_prost_writes() {
        let long_problem = "m=4096,n=4096,k=4096;".repeat(20);
        let pairs = vec![
            (
                key("trtllm", "m=1", None),
                result("{\"tile\":128}", 12.5, 1_700_000_000_000),
            ),
            (key("", "", Some(0)), result("", 0.0, 0)),
            (
                key("bitblas", &long_problem, Some(127)),
                result("[]", 1e-9, -5),
            ),
            (
                key("ns", "p", Some(u32::MAX)),
                result("{}", f64::MAX, i64::MIN),
            ),
            (
                key("\u{e9}\0ns", "p\0\u{1f600}", None),
                result("\"\u{e9}\"", 3.5, 0),
            ),
        ];
        let mut encoded = EncodedEntries::default();
        for (key, result) in &pairs {
            encoded.push(&StoredEntry::new(key, result));
        }
        let expected = v1::ScanResponse {
            entries: pairs
                .iter()
                .map(|(key, result)| crate::model::entry::to_wire_entry(key, result))
                .collect(),
        };
        assert_eq!(encoded.len(), pairs.len());
        assert_eq!(encoded.encoded_len(), expected.encoded_len());
        let bytes = encoded.encode_to_vec();
        assert_eq!(bytes, expected.encode_to_vec());
        assert_eq!(
            v1::LookupResponse::decode(bytes.as_slice()).unwrap().hits,
            expected.entries
        );
    }
}

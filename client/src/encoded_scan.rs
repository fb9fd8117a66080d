//! Owns the Scan whose chunks arrive still encoded: each `ScanResponse` message as the daemon
//! sent it, for a caller that decodes the chunks elsewhere while the next ones arrive. The Python
//! binding does: its calling thread decodes a chunk and builds its Python objects while the
//! runtime thread receives the next, so a Scan's decoding overlaps its transfer instead of
//! following it on the one thread that reads the socket.

use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::Bytes;
use tonic::Status;
use tunecache_proto::limits::MAX_MESSAGE_BYTES;
use tunecache_proto::v1;

use crate::{Client, Result, DEFAULT_SCAN_TIMEOUT};

const SCAN_PATH: &str = "/tunecache.v1.TuneCache/Scan";

/// Encodes the ScanRequest as prost does; hands each response message over undecoded.
#[derive(Debug, Default, Clone, Copy)]
struct EncodedResponses;

impl Codec for EncodedResponses {
    type Encode = v1::ScanRequest;
    type Decode = Bytes;
    type Encoder = RequestEncoder;
    type Decoder = ResponseBytes;

    fn encoder(&mut self) -> Self::Encoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ResponseBytes
    }
}

#[derive(Debug, Clone, Copy)]
struct RequestEncoder;

impl Encoder for RequestEncoder {
    type Item = v1::ScanRequest;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        prost::Message::encode(&item, dst)
            .map_err(|error| Status::internal(format!("encoding the Scan request: {error}")))
    }
}

#[derive(Debug, Clone, Copy)]
struct ResponseBytes;

impl Decoder for ResponseBytes {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Client {
    /// [`Client::scan_with`] (in the filter's view, else this client's) as the daemon streams
    /// it, each chunk (up to 1,024 entries) an encoded `ScanResponse` (`prost::Message::decode`
    /// reads it).
    pub async fn scan_encoded(
        &self,
        mut filter: v1::ScanRequest,
    ) -> Result<tonic::codec::Streaming<Bytes>> {
        if filter.view.is_empty() {
            filter.view.clone_from(&self.view);
        }
        let answer = crate::opening::call(filter, DEFAULT_SCAN_TIMEOUT, |request| {
            let channel = self.channel.clone();
            async move {
                let mut grpc = tonic::client::Grpc::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES);
                grpc.ready().await.map_err(|error| {
                    Status::unavailable(format!("tunecached is not ready: {error}"))
                })?;
                let path = PathAndQuery::from_static(SCAN_PATH);
                grpc.server_streaming(request, path, EncodedResponses).await
            }
        });
        Ok(answer.await?.into_inner())
    }
}

//! Raw gRPC calls: request bytes sent as they are and response bytes handed back, for the
//! requests no client library would build (a message that does not decode, a flood of empty
//! elements).

use std::time::Duration;

use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::Status;

/// Sends request bytes as they are and hands back the response bytes.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

pub struct RawEncoder;
pub struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// One call of `method` with `body` as the request message, its first response message
/// awaited (a server-streaming method's refusal arrives as the call's status).
pub async fn raw_unary(
    channel: Channel,
    method: &'static str,
    body: Vec<u8>,
) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|error| Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(body);
    request.set_timeout(Duration::from_secs(300));
    grpc.unary(request, PathAndQuery::from_static(method), RawCodec)
        .await
        .map(drop)
}

//! Length-delimited prost frames of the daemon <-> worker protocol (`tunecache.tuner.v1`).
//!
//! Each frame is a varint length followed by one message, exactly what prost's
//! `encode_length_delimited` writes. The worker side is blocking (`std::io`), the daemon's
//! supervisor side is async (tokio); both live here so the two ends cannot drift apart.

use std::io::{self, Read, Write};

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Frames larger than this are treated as a corrupt stream rather than allocated.
pub const MAX_FRAME_BYTES: u64 = 64 << 20;

fn too_large(len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("frame of {len} bytes exceeds {MAX_FRAME_BYTES}"),
    )
}

fn decode<M: Message + Default>(bytes: &[u8]) -> io::Result<M> {
    M::decode(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Accumulates a varint one byte at a time; returns the value once the last byte is seen.
fn push_varint_byte(value: &mut u64, shift: &mut u32, byte: u8) -> io::Result<Option<u64>> {
    if *shift >= 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame length varint is too long",
        ));
    }
    *value |= u64::from(byte & 0x7f) << *shift;
    *shift += 7;
    Ok((byte & 0x80 == 0).then_some(*value))
}

/// Writes one frame and flushes, so the peer sees it at once.
pub fn write_frame<W: Write, M: Message>(writer: &mut W, message: &M) -> io::Result<()> {
    writer.write_all(&message.encode_length_delimited_to_vec())?;
    writer.flush()
}

/// Reads one frame; `Ok(None)` on a clean end of stream before the first byte of a frame.
pub fn read_frame<R: Read, M: Message + Default>(reader: &mut R) -> io::Result<Option<M>> {
    let (mut value, mut shift) = (0u64, 0u32);
    let mut first = true;
    let len = loop {
        let mut byte = [0u8; 1];
        if reader.read(&mut byte)? == 0 {
            if first {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        first = false;
        if let Some(len) = push_varint_byte(&mut value, &mut shift, byte[0])? {
            break len;
        }
    };
    if len > MAX_FRAME_BYTES {
        return Err(too_large(len));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body)?;
    decode(&body).map(Some)
}

/// Async twin of [`write_frame`].
pub async fn write_frame_async<W: AsyncWrite + Unpin, M: Message>(
    writer: &mut W,
    message: &M,
) -> io::Result<()> {
    writer
        .write_all(&message.encode_length_delimited_to_vec())
        .await?;
    writer.flush().await
}

/// Async twin of [`read_frame`]. Not cancel-safe: run it in a task of its own.
pub async fn read_frame_async<R: AsyncRead + Unpin, M: Message + Default>(
    reader: &mut R,
) -> io::Result<Option<M>> {
    let (mut value, mut shift) = (0u64, 0u32);
    let mut first = true;
    let len = loop {
        let mut byte = [0u8; 1];
        if reader.read(&mut byte).await? == 0 {
            if first {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        first = false;
        if let Some(len) = push_varint_byte(&mut value, &mut shift, byte[0])? {
            break len;
        }
    };
    if len > MAX_FRAME_BYTES {
        return Err(too_large(len));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body).await?;
    decode(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::v1::{to_worker, ToWorker, TuneJob};

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let job = ToWorker {
            msg: Some(to_worker::Msg::Job(TuneJob {
                job_id: 300,
                op: "gemm".into(),
                problem: "x".repeat(200),
                device: "cpu|x|y".into(),
                timeout_ms: 5,
                excluded: Vec::new(),
            })),
        };
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &job).unwrap();
        write_frame(&mut bytes, &job).unwrap();
        let mut reader = bytes.as_slice();
        assert_eq!(
            read_frame::<_, ToWorker>(&mut reader).unwrap(),
            Some(job.clone())
        );
        assert_eq!(read_frame::<_, ToWorker>(&mut reader).unwrap(), Some(job));
        assert_eq!(read_frame::<_, ToWorker>(&mut reader).unwrap(), None);
        let truncated = &bytes[..10];
        assert!(read_frame::<_, ToWorker>(&mut &truncated[..]).is_err());
    }
}

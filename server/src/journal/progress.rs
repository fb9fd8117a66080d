//! How far a replay has got, read by others while it runs: the daemon answers every call
//! meanwhile with it ("replaying the journal: N of M frames").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::frame::{FrameLimits, HEADER_LEN, MAGIC};

/// A replay's progress: frames replayed of the frames the file holds, then whether the
/// Forgets it found are being applied. Shared between the replaying thread and readers.
#[derive(Debug, Default)]
pub struct ReplayProgress {
    /// The journal is read: what is left is its frames.
    reading: AtomicBool,
    frames_done: AtomicU64,
    frames_total: AtomicU64,
    applying_forgets: AtomicBool,
}

impl ReplayProgress {
    /// Frames replayed so far and the frames the journal holds.
    pub fn frames(&self) -> (u64, u64) {
        let done = self.frames_done.load(Ordering::Relaxed);
        (done, self.frames_total.load(Ordering::Relaxed).max(done))
    }

    /// What a caller is told while the replay runs.
    pub fn describe(&self) -> String {
        let (done, total) = self.frames();
        if !self.reading.load(Ordering::Relaxed) {
            "opening: locking and reading the state directory".to_owned()
        } else if self.applying_forgets.load(Ordering::Relaxed) {
            format!("replaying the journal: {total} of {total} frames read, applying its Forgets")
        } else {
            format!("replaying the journal: {done} of {total} frames")
        }
    }

    pub(super) fn frame_done(&self) {
        self.frames_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the frames of `buf` by their headers alone (no checksum, no decoding): the
    /// "of M". Damage ends the count there: M is then a lower bound.
    pub(super) fn count_frames(&self, buf: &[u8], limits: FrameLimits) {
        let mut frames = 0u64;
        let mut pos = 0usize;
        while let Some(header) = buf.get(pos..pos + HEADER_LEN) {
            let Ok(len) = <[u8; 4]>::try_from(&header[4..8]) else {
                break;
            };
            let len = u32::from_le_bytes(len) as usize;
            if header[..4] != MAGIC || len > limits.max || pos + HEADER_LEN + len > buf.len() {
                break;
            }
            frames += 1;
            pos += HEADER_LEN + len;
        }
        self.frames_total.store(frames, Ordering::Relaxed);
        self.reading.store(true, Ordering::Relaxed);
    }

    /// The frames are read; what remains is applying the tombstones they held.
    pub fn applying_forgets(&self) {
        self.applying_forgets.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_how_many_frames_of_how_many() {
        let progress = ReplayProgress::default();
        assert_eq!(
            progress.describe(),
            "opening: locking and reading the state directory"
        );
        let frame = |payload: &[u8]| {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&[0; 4]);
            bytes.extend_from_slice(payload);
            bytes
        };
        let mut buf = frame(b"one");
        buf.extend(frame(b"two"));
        buf.extend_from_slice(b"TCJ1\xff"); // a torn header ends the count
        progress.count_frames(&buf, FrameLimits::DEFAULT);
        progress.frame_done();
        assert_eq!(progress.describe(), "replaying the journal: 1 of 2 frames");
        progress.applying_forgets();
        assert_eq!(
            progress.describe(),
            "replaying the journal: 2 of 2 frames read, applying its Forgets"
        );
    }
}

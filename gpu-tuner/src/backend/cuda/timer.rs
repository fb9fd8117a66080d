//! Timing on the GPU: CUDA events around samples of back-to-back runs, the spin kernel that
//! keeps the GPU busy while the host queues them, and how many copies of a problem's
//! buffers cold-L2 timing rotates through.
//!
//! Timing follows `measure`: a spin kernel keeps the GPU busy while the host queues N
//! back-to-back runs between one pair of events; cold-L2 timing rotates through copies of
//! the buffers that together exceed twice the L2 size. What a sample's figures mean
//! ([`sample_outcome`]) and how many copies fit ([`rotation_plan`]) are pure rules; the
//! types here only make the driver calls.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys as driver_sys;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::sticky::driver_error;
use crate::error::TuneError;
use crate::measure::{rotation_sets, DelayPolicy};

/// At most this many copies of a problem's buffers for cold-L2 rotation.
const MAX_ROTATION_SETS: u64 = 64;

/// The delay kernel, as PTX so that it loads without NVRTC (gemm jobs do not need NVRTC):
/// it spins on the global nanosecond timer until `ns` have passed. PTX ISA 6.0 for sm_50
/// loads on every driver and GPU this backend supports; the driver compiles it for the GPU.
const SPIN_PTX: &str = r#"
.version 6.0
.target sm_50
.address_size 64

.visible .entry tunecache_spin(
    .param .u64 tunecache_spin_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [tunecache_spin_ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
SPIN:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra SPIN;
    ret;
}
"#;

/// What one timed sample of `runs` runs that took `elapsed_ms` between its events counts
/// as: the mean GPU time of one run in microseconds, or `None` when it must be taken again.
/// A sample the host out-ran (`starved`: the GPU may have idled inside it) is taken once
/// more; the second one counts whatever it shows, so a slow host cannot stall tuning.
pub(super) fn sample_outcome(
    elapsed_ms: f32,
    runs: u32,
    starved: bool,
    retaken: bool,
) -> Option<f64> {
    (!starved || retaken).then(|| f64::from(elapsed_ms) * 1e3 / f64::from(runs))
}

/// Times samples of back-to-back runs: a spin kernel first, so the GPU is busy while the
/// host queues the runs, then the runs between one pair of events.
pub(super) struct SampleTimer {
    start: CudaEvent,
    end: CudaEvent,
    spin: CudaFunction,
    delay: DelayPolicy,
    /// Samples taken again because the host out-ran the delay.
    retaken: u32,
}

impl SampleTimer {
    pub(super) fn new(context: &Arc<CudaContext>) -> Result<Self, TuneError> {
        let event = || {
            context
                .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| driver_error("creating a CUDA event", e))
        };
        let module = context
            .load_module(Ptx::from_src(SPIN_PTX))
            .map_err(|e| driver_error("loading the delay kernel", e))?;
        let spin = module
            .load_function("tunecache_spin")
            .map_err(|e| driver_error("finding the delay kernel", e))?;
        Ok(SampleTimer {
            start: event()?,
            end: event()?,
            spin,
            delay: DelayPolicy::default(),
            retaken: 0,
        })
    }

    /// Queues the delay kernel, then `runs` calls of `enqueue` between the events; returns
    /// the mean GPU time of one run in microseconds.
    pub(super) fn sample(
        &mut self,
        stream: &Arc<CudaStream>,
        runs: u32,
        enqueue: &mut dyn FnMut() -> Result<(), TuneError>,
    ) -> Result<f64, TuneError> {
        let runs = runs.max(1);
        let mut retaken = false;
        loop {
            let ns = (self.delay.delay_us * 1e3) as u64;
            let mut builder = stream.launch_builder(&self.spin);
            builder.arg(&ns);
            // SAFETY: the kernel takes one u64 by value, as pushed.
            let one = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { builder.launch(one) }
                .map_err(|e| driver_error("launching the delay kernel", e))?;
            self.start
                .record(stream)
                .map_err(|e| driver_error("recording the start event", e))?;
            let queued = Instant::now();
            for _ in 0..runs {
                enqueue()?;
            }
            self.end
                .record(stream)
                .map_err(|e| driver_error("recording the end event", e))?;
            let enqueue_us = queued.elapsed().as_secs_f64() * 1e6;
            self.end
                .synchronize()
                .map_err(|e| driver_error("waiting for the timed runs", e))?;
            let ms = self
                .start
                .elapsed_ms(&self.end)
                .map_err(|e| driver_error("reading the event timer", e))?;
            let starved = self.delay.observe(enqueue_us);
            if let Some(mean_us) = sample_outcome(ms, runs, starved, retaken) {
                return Ok(mean_us);
            }
            retaken = true;
            self.retaken += 1;
        }
    }

    pub(super) fn queued_behind(&self) -> String {
        format!(
            "spin kernel on %globaltimer, {:.0} us at the end (grown to cover the host's queueing; {} sample(s) retaken)",
            self.delay.delay_us, self.retaken
        )
    }
}

/// How many copies of `set_bytes` of buffers to rotate through on a GPU whose driver
/// reports an L2 of `l2_bytes` (taken as at least 1 MiB) with `free_bytes` of memory free,
/// and the method's text. The copies may take half of what is free, besides the set
/// already allocated.
pub(super) fn rotation_plan(set_bytes: u64, l2_bytes: u64, free_bytes: u64) -> (u64, String) {
    let l2 = l2_bytes.max(1 << 20);
    // Half of what is free, less the set already allocated.
    let budget = (free_bytes / 2).saturating_add(set_bytes);
    let (sets, enough) = rotation_sets(set_bytes, l2, budget, MAX_ROTATION_SETS);
    let text = format!(
        "rotating {sets} copies of the buffers ({set_bytes} bytes each; L2 {l2} bytes){}",
        if enough {
            ""
        } else {
            "; too little memory for more, so partly warm"
        }
    );
    (sets, text)
}

/// How many copies of `set_bytes` of buffers to rotate through, and the method's text:
/// [`rotation_plan`] on the GPU's L2 size and free memory, or one set when L2 stays warm.
pub(super) fn plan_rotation(
    context: &Arc<CudaContext>,
    set_bytes: u64,
    flush_l2: bool,
) -> Result<(u64, String), TuneError> {
    if !flush_l2 {
        return Ok((1, "off".to_string()));
    }
    let l2 = context
        .attribute(driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(|e| driver_error("reading the L2 size", e))?
        .max(0) as u64;
    let (free, _total) = context
        .mem_get_info()
        .map_err(|e| driver_error("reading free device memory", e))?;
    Ok(rotation_plan(set_bytes, l2, free as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starved_sample_is_taken_once_more_and_then_counts() {
        // 2 ms for 4 runs: 500 us a run.
        assert_eq!(sample_outcome(2.0, 4, false, false), Some(500.0));
        // The host out-ran the delay: take it again.
        assert_eq!(sample_outcome(2.0, 4, true, false), None);
        // Only once: the retaken sample counts even if starved.
        assert_eq!(sample_outcome(2.0, 4, true, true), Some(500.0));
        assert_eq!(sample_outcome(0.5, 1, false, true), Some(500.0));
    }

    #[test]
    fn rotation_takes_half_the_free_memory_and_at_least_a_1_mib_l2() {
        let mib = 1u64 << 20;
        // 10 MiB sets on a 50 MiB L2 want 11 copies; 1 GiB free affords them.
        let (sets, text) = rotation_plan(10 * mib, 50 * mib, 1024 * mib);
        assert_eq!(sets, 11);
        assert_eq!(
            text,
            format!(
                "rotating 11 copies of the buffers ({} bytes each; L2 {} bytes)",
                10 * mib,
                50 * mib
            )
        );
        // 40 MiB free: half of it (20 MiB) plus the set already there is 3 sets.
        let (sets, text) = rotation_plan(10 * mib, 50 * mib, 40 * mib);
        assert_eq!(sets, 3);
        assert!(
            text.ends_with("; too little memory for more, so partly warm"),
            "{text}"
        );
        // A driver that reports no L2: taken as 1 MiB, so 1 MiB sets want 3 copies.
        let (sets, text) = rotation_plan(mib, 0, 1024 * mib);
        assert_eq!(sets, 3);
        assert!(text.contains(&format!("L2 {mib} bytes")), "{text}");
    }

    #[test]
    fn the_delay_kernel_is_one_entry_taking_a_u64() {
        assert!(SPIN_PTX.contains(".visible .entry tunecache_spin("));
        assert!(SPIN_PTX.contains(".param .u64 tunecache_spin_ns"));
        assert_eq!(SPIN_PTX.matches('{').count(), SPIN_PTX.matches('}').count());
    }
}

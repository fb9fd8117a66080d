//! CUDA backend (placeholder while the real one is written).
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

use super::Backend;
use crate::measure::MeasureConfig;

pub struct CudaBackend {
    devices: Vec<v1::Device>,
}

impl CudaBackend {
    pub fn open(_measure: MeasureConfig) -> Result<Self, String> {
        Err("not built yet".to_string())
    }
    pub fn summary(&self) -> String {
        String::new()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn devices(&self) -> &[v1::Device] {
        &self.devices
    }
    fn tune(&mut self, _job: &TuneJob) -> Result<v1::Result, String> {
        Err("not built".into())
    }
}

//! Fixtures the unit tests of several modules share: a file as TensorRT-LLM writes it, and
//! entries as the daemon stores them.

use tunecache_proto::v1::{Entry, Key, Result as TuneResult};

/// A file as TensorRT-LLM writes it (json.dump, indent=2), with odd tactic reprs and float
/// min_times; `1e-3` is not how Python spells 0.001, which checks that text is kept as is.
pub(crate) const PYTHON_WRITTEN_FILE: &str = r#"{
  "metadata": {
    "lib_version": "1.1.0rc2",
    "creation_timestamp": 1718000000.1234567,
    "device_name": "NVIDIA H200",
    "device_capability": [
      9,
      0
    ]
  },
  "rank_0": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "(128, 'tile \"(a)\"', ('x', 2))",
      "min_time": 0.1
    },
    "('trtllm::fp8_gemm', 'Fp8Runner', '-123', ((8, 4096), (4096, 4096)))": {
      "runner_id": 2,
      "tactic": "17",
      "min_time": 1e-3
    }
  },
  "shared": {
    "(\"it's::op\", 'R', ())": {
      "runner_id": 1,
      "tactic": "{'tile': (64, 128), 'stages': 3}",
      "min_time": 12.345678901234567
    }
  },
  "rank_1": {
    "('trtllm::fused_moe::gemm1', 'MoERunner', (1, 4096), 0)": {
      "runner_id": 0,
      "tactic": "-1",
      "min_time": 7
    },
    "('caf\u00e9::op',)": {
      "runner_id": 3,
      "tactic": "None",
      "min_time": 2.5e-05
    }
  },
  "rank_2": {}
}"#;

pub(crate) fn entry_for<'a>(entries: &'a [Entry], problem: &str, rank: Option<u32>) -> &'a Entry {
    entries
        .iter()
        .find(|entry| {
            let key = entry.key.as_ref().expect("key");
            key.problem == problem && key.rank == rank
        })
        .unwrap_or_else(|| panic!("no entry for {problem} rank {rank:?}"))
}

pub(crate) fn native_entry(
    namespace: &str,
    problem: &str,
    device: &str,
    config: &str,
    time_us: f64,
) -> Entry {
    Entry {
        key: Some(Key {
            namespace: namespace.to_owned(),
            op: "trtllm::op".to_owned(),
            device: device.to_owned(),
            problem: problem.to_owned(),
            rank: Some(0),
        }),
        result: Some(TuneResult {
            config: config.to_owned(),
            time_us,
            tuned_by: "rank 0".to_owned(),
            tuned_at_unix_ms: 0,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

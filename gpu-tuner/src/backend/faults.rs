//! Fault injection for tests: makes named candidates of the cpu backend fail the way a bad
//! GPU candidate does (abort, a poisoned context, a hang, a wrong answer), so fault isolation
//! is tested through the real worker and supervisor on machines without a GPU.
//!
//! Enabled only by the worker's hidden `--inject-fault NAME=KIND` flag, which the worker
//! accepts with the cpu backend only.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use tunecache_proto::tuner::POISONED_EXIT_CODE;

/// What happens when a faulty candidate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The process aborts (SIGABRT), as a crash inside a driver or library does.
    Abort,
    /// The process exits as after a sticky CUDA error ([`POISONED_EXIT_CODE`]).
    Poison,
    /// The candidate never finishes, as an endless kernel.
    Hang,
    /// The candidate passes the small correctness case, is the fastest by far, and gives a
    /// wrong answer on the real problem: the fastest-but-wrong winner.
    Wrong,
}

/// Faults by candidate name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan(BTreeMap<String, Fault>);

impl FromStr for Fault {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "abort" => Ok(Fault::Abort),
            "poison" => Ok(Fault::Poison),
            "hang" => Ok(Fault::Hang),
            "wrong" => Ok(Fault::Wrong),
            other => Err(format!(
                "unknown fault {other:?} (expected abort, poison, hang or wrong)"
            )),
        }
    }
}

impl FaultPlan {
    /// Reads `NAME=KIND` specs.
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        let mut plan = BTreeMap::new();
        for spec in specs {
            let (name, kind) = spec
                .split_once('=')
                .ok_or_else(|| format!("--inject-fault {spec:?}: expected NAME=KIND"))?;
            plan.insert(name.to_string(), kind.parse()?);
        }
        Ok(FaultPlan(plan))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `candidate` is to compute a wrong answer.
    pub fn is_wrong(&self, candidate: &str) -> bool {
        self.0.get(candidate) == Some(&Fault::Wrong)
    }

    /// Called after the worker announced `candidate`: carries out a process-level fault.
    pub fn on_running(&self, candidate: &str) {
        match self.0.get(candidate) {
            Some(Fault::Abort) => {
                eprintln!("tunecache-tuner: injected fault: aborting in candidate {candidate}");
                std::process::abort();
            }
            Some(Fault::Poison) => {
                eprintln!("tunecache-tuner: injected fault: sticky error in candidate {candidate}; exiting");
                std::process::exit(POISONED_EXIT_CODE);
            }
            Some(Fault::Hang) => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            Some(Fault::Wrong) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let plan = FaultPlan::parse(&["a=abort".into(), "b=wrong".into()]).unwrap();
        assert!(plan.is_wrong("b"));
        assert!(!plan.is_wrong("a"));
        assert!(!plan.is_empty());
        // A candidate without a fault runs normally (this returns).
        plan.on_running("c");
        plan.on_running("b");
        assert!(FaultPlan::parse(&["a".into()]).is_err());
        assert!(FaultPlan::parse(&["a=explode".into()]).is_err());
    }
}

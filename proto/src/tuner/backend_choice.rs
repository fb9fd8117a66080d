//! Which backend the worker measures on: the daemon's `--tuner-backend` flag, passed on as
//! the worker's `--backend`.

use std::str::FromStr;

/// The `--backend` choice of the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// cuda when the driver loads and shows a device, else cpu.
    Auto,
    Cuda,
    Cpu,
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(BackendChoice::Auto),
            "cuda" => Ok(BackendChoice::Cuda),
            "cpu" => Ok(BackendChoice::Cpu),
            other => Err(format!(
                "unknown backend {other:?} (expected auto, cuda or cpu)"
            )),
        }
    }
}

impl BackendChoice {
    /// The flag value, as `from_str` reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Cpu => "cpu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_text_round_trips() {
        for choice in [BackendChoice::Auto, BackendChoice::Cuda, BackendChoice::Cpu] {
            assert_eq!(choice.as_str().parse(), Ok(choice));
        }
        assert!("gpu".parse::<BackendChoice>().is_err());
    }
}

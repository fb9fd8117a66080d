//! The model of the cache, independent of how it is stored or sent: keys and results
//! (`entry`), the one rule that decides which result wins (`merge`) and what a Forget removes
//! (`forget`), and the checks every request passes before anything is applied (`validate`).

pub mod entry;
pub mod forget;
pub mod merge;
pub(crate) mod validate;

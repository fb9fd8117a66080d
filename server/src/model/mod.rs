//! The model of the cache, independent of how it is stored or sent: keys and results
//! (`entry`) and the files a result names (`artifacts`), the one rule that decides which result wins (`merge`) and what a Forget removes
//! (`forget`) and the tombstones it leaves (`tombstones`), the days entries are last used on and when they expire (`lifecycle`), the checks every request passes before anything is applied (`validate`), and
//! the rules for the names the daemon writes where others read them (`names`), and the key
//! nodes share to prove they wrote what others read (`shared_key`).

pub mod artifacts;
pub mod entry;
pub mod forget;
pub mod lifecycle;
pub mod merge;
pub mod names;
pub mod shared_key;
#[cfg(test)]
pub(crate) mod testing;
pub mod tombstones;
pub(crate) mod validate;

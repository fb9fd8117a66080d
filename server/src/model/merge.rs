//! The one rule that decides which result wins, and what a Forget removes. Every path that
//! changes the store uses it: Record, journal replay, snapshot load, node-to-node merge and
//! Forget.
//!
//! The rule is a total order on results: the higher `forget_epoch` wins (a result recorded
//! after a Forget of its key beats every result recorded before it: `model::forget`), then
//! lower `time_us`, and ties are broken on the config text, then `tuned_by`, then
//! `tuned_at_unix_ms` (earlier wins), then the artifacts' canonical bytes (`model::artifacts`),
//! so two results that differ only in their files still compare the same way on every node. A tombstone removes the results of its scope whose
//! epoch is below its stamp (`forget::drops`), which, with epochs compared first, never
//! removes a result while keeping one it beat. So merging the same results and forgets in
//! any order, on any node, ends with the same winner and therefore the same bytes.

use std::cmp::Ordering;

use crate::model::entry::{ResultView, TunedResult};

/// What merging an incoming result into the current one decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The incoming result is new or beats the current one: store it.
    Replace,
    /// The current result is as good or better: nothing changes.
    Keep,
}

/// Orders results from best to worst. `Ordering::Less` means `a` beats `b`.
pub fn rank_results(a: &TunedResult, b: &TunedResult) -> Ordering {
    rank_views(a.view(), b.view())
}

/// The rule itself, on borrowed results (decoded ones, or views of stored wire bytes).
pub fn rank_views(a: ResultView<'_>, b: ResultView<'_>) -> Ordering {
    b.forget_epoch
        .cmp(&a.forget_epoch)
        .then_with(|| a.time_us.total_cmp(&b.time_us))
        .then_with(|| a.config.cmp(b.config))
        .then_with(|| a.tuned_by.cmp(b.tuned_by))
        .then_with(|| a.tuned_at_unix_ms.cmp(&b.tuned_at_unix_ms))
        .then_with(|| a.artifacts.cmp(&b.artifacts))
}

/// Decides whether `incoming` replaces `current`. Equal results keep the current one, so a
/// repeated Record is reported as unchanged and writes nothing.
pub fn merge(current: Option<&TunedResult>, incoming: &TunedResult) -> MergeOutcome {
    merge_views(current.map(TunedResult::view), incoming.view())
}

/// `merge` on borrowed results: what the store uses against its wire-form entries.
pub fn merge_views(current: Option<ResultView<'_>>, incoming: ResultView<'_>) -> MergeOutcome {
    merge_read(current, || incoming)
}

/// `merge_views`, reading the incoming result only when there is a current one to beat: a
/// journal's replay meets most keys once, and reading a stored result costs a parse.
pub fn merge_read<'a>(
    current: Option<ResultView<'_>>,
    incoming: impl FnOnce() -> ResultView<'a>,
) -> MergeOutcome {
    match current {
        None => MergeOutcome::Replace,
        Some(current) if rank_views(incoming(), current) == Ordering::Less => MergeOutcome::Replace,
        Some(_) => MergeOutcome::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(time_us: f64, config: &str, tuned_by: &str, at: i64) -> TunedResult {
        TunedResult {
            config: config.to_owned(),
            time_us,
            tuned_by: tuned_by.to_owned(),
            tuned_at_unix_ms: at,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    #[test]
    fn lower_time_wins_and_equal_keeps_current() {
        let fast = result(1.0, "{}", "a", 1);
        let slow = result(2.0, "{}", "a", 1);
        assert_eq!(merge(None, &slow), MergeOutcome::Replace);
        assert_eq!(merge(Some(&slow), &fast), MergeOutcome::Replace);
        assert_eq!(merge(Some(&fast), &slow), MergeOutcome::Keep);
        assert_eq!(merge(Some(&fast), &fast.clone()), MergeOutcome::Keep);
    }

    #[test]
    fn a_result_recorded_after_a_forget_beats_any_recorded_before() {
        let bogus = result(0.0, r#"{"bogus":true}"#, "a", 1);
        let after = TunedResult {
            forget_epoch: 7,
            ..result(41.5, "{}", "b", 2)
        };
        assert_eq!(rank_results(&after, &bogus), Ordering::Less);
        assert_eq!(merge(Some(&after), &bogus), MergeOutcome::Keep);
    }

    #[test]
    fn ties_break_on_config_then_tuner_then_time() {
        let a = result(1.0, r#"{"t":1}"#, "z", 9);
        let b = result(1.0, r#"{"t":2}"#, "a", 1);
        assert_eq!(rank_results(&a, &b), Ordering::Less);
        let c = result(1.0, "{}", "host-a", 5);
        let d = result(1.0, "{}", "host-b", 1);
        assert_eq!(rank_results(&c, &d), Ordering::Less);
        let e = result(1.0, "{}", "h", 1);
        let f = result(1.0, "{}", "h", 2);
        assert_eq!(rank_results(&e, &f), Ordering::Less);
    }

    #[test]
    fn any_merge_order_gives_the_same_winner() {
        let candidates = [
            result(3.0, "{}", "a", 1),
            result(1.0, r#"{"b":1}"#, "b", 2),
            result(1.0, r#"{"a":1}"#, "c", 3),
            result(2.0, "{}", "d", 4),
        ];
        let mut orders = vec![
            vec![0, 1, 2, 3],
            vec![3, 2, 1, 0],
            vec![1, 3, 0, 2],
            vec![2, 0, 3, 1],
        ];
        let mut winners = Vec::new();
        for order in orders.drain(..) {
            let mut current: Option<TunedResult> = None;
            for index in order {
                if merge(current.as_ref(), &candidates[index]) == MergeOutcome::Replace {
                    current = Some(candidates[index].clone());
                }
            }
            winners.push(current);
        }
        assert!(winners.iter().all(|w| w == &winners[0]));
        assert_eq!(
            winners[0].as_ref().map(|w| w.config.as_str()),
            Some(r#"{"a":1}"#)
        );
    }
}

//! Fuzz target for the problem canonicaliser (`tuner::problem::canonicalize`), which the daemon runs
//! on every `tunecache`-namespace key a rank sends, and whose output is the cache key.
//!
//! proptest rather than cargo-fuzz, so that it runs on stable inside `cargo test`; see the
//! same note in server/tests/fuzz_targets.rs. Problems are generated as JSON objects with
//! adversarial values (bounds, off-by-one, floats that do not fit, subnormals, `-0.0`,
//! duplicate names, unknown fields) in shuffled member order, plus token soup and raw text.
//! `PROPTEST_CASES=N` runs longer (docs/ci.md).
//!
//! Properties: never a panic; canonical text is a fixed point (canonicalising it again gives
//! the same bytes, and it parses to the same problem); and the canonical text does not
//! depend on member order or on the order of buffers and candidates.

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tunecache_proto::tuner::problem::{canonicalize, parse_gemm, parse_nvrtc};

fn pick(items: &[Value]) -> impl Strategy<Value = Value> {
    prop::sample::select(items.to_vec())
}

/// Mostly valid, so that most problems get past validation to the canonical text; now and
/// then a value just outside the rules.
fn mostly<T: std::fmt::Debug + Clone + 'static>(
    valid: impl Strategy<Value = T> + 'static,
    invalid: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = T> {
    prop_oneof![40 => valid.boxed(), 1 => invalid.boxed()]
}

fn dimension() -> impl Strategy<Value = Value> {
    mostly(
        prop_oneof![
            (1u64..=4096).prop_map(|n| json!(n)),
            pick(&[json!(1), json!(65_536)]),
        ],
        pick(&[
            json!(0),
            json!(65_537),
            json!(-1),
            json!(4096.0),
            json!(u64::MAX),
            json!("4096"),
            Value::Null,
        ]),
    )
}

/// Finite floats with the values whose text is hardest to round-trip; now and then one that
/// is not a finite number.
fn float() -> impl Strategy<Value = Value> {
    mostly(
        prop_oneof![
            pick(&[
                json!(0.0),
                json!(-0.0),
                json!(f64::from_bits(1)),
                json!(f64::MIN_POSITIVE),
                json!(2.225_073_858_507_201e-308),
                json!(f32::MAX),
                json!(f64::from(f32::from_bits(1))),
                json!(0.1),
                json!(0.1 + 0.2),
                json!(1e-3),
            ]),
            (0u64..0x7ff0_0000_0000_0000).prop_map(|bits| json!(f64::from_bits(bits))),
            any::<u32>()
                .prop_map(f32::from_bits)
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(|x| json!(f64::from(x).abs())),
        ],
        pick(&[
            json!(-5),
            json!(f64::from(f32::MAX) * (1.0 + f64::EPSILON)),
            json!(3.5e38),
            json!("1.0"),
            Value::Null,
        ]),
    )
}

fn gemm() -> impl Strategy<Value = Map<String, Value>> {
    (
        dimension(),
        dimension(),
        dimension(),
        mostly(
            pick(&[json!("f16"), json!("bf16"), json!("f32")]),
            pick(&[json!("F16"), json!(16)]),
        ),
        mostly(
            pick(&[json!("nn"), json!("nt"), json!("tn"), json!("tt")]),
            pick(&[json!("n"), json!("NN")]),
        ),
        prop::option::weighted(0.05, pick(&[json!(1), json!({})])),
    )
        .prop_map(|(m, n, k, dtype, layout, extra)| {
            let mut object = Map::new();
            for (name, value) in [
                ("m", m),
                ("n", n),
                ("k", k),
                ("dtype", dtype),
                ("layout", layout),
            ] {
                if !value.is_null() {
                    object.insert(name.into(), value);
                }
            }
            if let Some(extra) = extra {
                object.insert("stride".into(), extra);
            }
            object
        })
}

/// Buffer names come from this pool, so that args and checks usually name a buffer that exists.
const BUFFER_NAMES: [&str; 4] = ["x", "y", "_b2", "out"];
const CANDIDATE_NAMES: [&str; 4] = ["a", "b", "b256", "é ü"];

/// A buffer name for an arg or a check: mostly one of the problem's buffers.
fn buffer_name(names: Vec<&'static str>) -> impl Strategy<Value = Value> {
    mostly(
        prop::sample::select(names).prop_map(|name| json!(name)),
        pick(&[json!("2x"), json!(""), json!("a-b"), json!("é")]),
    )
}

fn buffer(name: &'static str) -> impl Strategy<Value = Value> {
    (
        mostly(Just(json!(name)), pick(&[json!("2x"), json!("")])),
        mostly(
            pick(&[
                json!("f32"),
                json!("f16"),
                json!("bf16"),
                json!("i32"),
                json!("u32"),
            ]),
            pick(&[json!("f64")]),
        ),
        mostly(
            prop_oneof![
                (1u64..=4096).prop_map(|n| json!(n)),
                Just(json!(1u64 << 30))
            ],
            pick(&[json!((1u64 << 30) + 1), json!(0)]),
        ),
        mostly(
            pick(&[json!("zeros"), json!("ones"), json!("random"), Value::Null]),
            pick(&[json!("nan")]),
        ),
    )
        .prop_map(|(name, dtype, len, init)| {
            let mut buffer = json!({"name": name, "dtype": dtype, "len": len});
            if !init.is_null() {
                buffer["init"] = init;
            }
            buffer
        })
}

fn buffers(names: Vec<&'static str>) -> impl Strategy<Value = Vec<Value>> {
    names
        .into_iter()
        .map(buffer)
        .collect::<Vec<_>>()
        .prop_shuffle()
}

fn arg(names: Vec<&'static str>) -> impl Strategy<Value = Value> {
    mostly(
        prop_oneof![
            buffer_name(names).prop_map(|name| json!({"buffer": name})),
            any::<i32>().prop_map(|v| json!({"i32": v})),
            any::<u32>().prop_map(|v| json!({"u32": v})),
            any::<i64>().prop_map(|v| json!({"i64": v})),
            any::<u64>().prop_map(|v| json!({"u64": v})),
            float().prop_map(|value| json!({"f32": value})),
        ],
        pick(&[
            json!({"i32": i64::from(i32::MAX) + 1}),
            json!({"u32": -1}),
            json!({"i32": 1, "u32": 1}),
            json!({}),
            json!([1]),
        ]),
    )
}

fn dims(max: u64) -> impl Strategy<Value = Value> {
    mostly(
        prop::collection::vec(1..=max, 1..=3).prop_map(|dims| json!(dims)),
        pick(&[
            json!([]),
            json!([0]),
            json!([1, 1, 1, 1]),
            json!([2048, 1, 1]),
        ]),
    )
}

fn candidate(name: &'static str) -> impl Strategy<Value = Value> {
    (
        mostly(Just(json!(name)), pick(&[json!(""), json!("\u{7}")])),
        prop::collection::btree_map(
            mostly(prop::sample::select(vec!["BLOCK", "N", "_X"]), Just("1BAD")),
            mostly(
                pick(&[json!("128"), json!(""), json!("a b")]),
                pick(&[json!("\n"), json!(1)]),
            ),
            0..3,
        ),
        dims(64),
        dims(8),
        mostly(
            pick(&[Value::Null, json!(0), json!(227 * 1024)]),
            Just(json!(227 * 1024 + 1)),
        ),
    )
        .prop_map(|(name, defines, grid, block, shared)| {
            let mut candidate =
                json!({"name": name, "defines": defines, "grid": grid, "block": block});
            if !shared.is_null() {
                candidate["shared_mem_bytes"] = shared;
            }
            candidate
        })
}

fn candidates(names: Vec<&'static str>) -> impl Strategy<Value = Vec<Value>> {
    names
        .into_iter()
        .map(candidate)
        .collect::<Vec<_>>()
        .prop_shuffle()
}

fn check(
    buffer_names: Vec<&'static str>,
    candidate_names: Vec<&'static str>,
) -> impl Strategy<Value = Value> {
    (
        buffer_name(buffer_names),
        mostly(
            prop_oneof![
                Just(Value::Null),
                prop::sample::select(candidate_names).prop_map(|n| json!(n))
            ],
            Just(json!("zz")),
        ),
        prop_oneof![Just(Value::Null), float()],
        prop_oneof![Just(Value::Null), float()],
        prop_oneof![Just(Value::Null), float()],
    )
        .prop_map(|(buffer, reference, expected_sum, rtol, atol)| {
            let mut check = json!({"buffer": buffer});
            for (name, value) in [
                ("reference", reference),
                ("expected_sum", expected_sum),
                ("rtol", rtol),
                ("atol", atol),
            ] {
                if !value.is_null() {
                    check[name] = value;
                }
            }
            check
        })
}

fn nvrtc() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::sample::subsequence(BUFFER_NAMES.to_vec(), 1..=3),
        prop::sample::subsequence(CANDIDATE_NAMES.to_vec(), 1..=3),
    )
        .prop_flat_map(|(buffer_names, candidate_names)| nvrtc_with(buffer_names, candidate_names))
}

fn nvrtc_with(
    buffer_names: Vec<&'static str>,
    candidate_names: Vec<&'static str>,
) -> impl Strategy<Value = Map<String, Value>> {
    (
        mostly(
            Just(json!(
                "extern \"C\" __global__ void k(float* y) { y[0] = BLOCK; }"
            )),
            pick(&[json!(""), json!("a\u{0}b")]),
        ),
        mostly(Just(json!("k")), pick(&[json!("2x"), json!("")])),
        buffers(buffer_names.clone()),
        prop::collection::vec(arg(buffer_names.clone()), 0..4),
        candidates(candidate_names.clone()),
        prop::option::weighted(0.7, check(buffer_names, candidate_names)),
    )
        .prop_map(|(source, kernel, buffers, args, candidates, check)| {
            let mut object = Map::new();
            object.insert("source".into(), source);
            object.insert("kernel".into(), kernel);
            object.insert("buffers".into(), Value::Array(buffers));
            object.insert("args".into(), Value::Array(args));
            object.insert("candidates".into(), Value::Array(candidates));
            if let Some(check) = check {
                object.insert("check".into(), check);
            }
            object
        })
}

/// Writes an object with its members in the order `order` gives, as a rank might.
fn text_in_order(object: &Map<String, Value>, order: &[usize]) -> String {
    let members: Vec<(&String, &Value)> = object.iter().collect();
    let mut parts = Vec::new();
    for &index in order {
        if let Some((name, value)) = members.get(index) {
            parts.push(format!("{}: {value}", Value::String((*name).clone())));
        }
    }
    format!("{{ {} }}", parts.join(" , "))
}

/// Canonical text is a fixed point and parses to the same problem.
fn check_canonical(op: &str, problem: &str) -> Result<Option<String>, TestCaseError> {
    let Ok(canonical) = canonicalize(op, problem) else {
        return Ok(None);
    };
    prop_assert_eq!(canonicalize(op, &canonical), Ok(canonical.clone()));
    match op {
        "gemm" => prop_assert_eq!(parse_gemm(&canonical), parse_gemm(problem)),
        "nvrtc" => {
            // Compare as canonical text: NaN-free, but -0.0 == 0.0 would hide a difference.
            let reparsed =
                serde_json::to_string(&parse_nvrtc(&canonical).expect("canonical parses"))
                    .expect("serialises");
            prop_assert_eq!(&reparsed, &canonical);
        }
        other => prop_assert!(false, "{other} canonicalised"),
    }
    Ok(Some(canonical))
}

fn shuffled_object() -> impl Strategy<Value = (String, Map<String, Value>, Vec<usize>)> {
    prop_oneof![
        gemm().prop_map(|object| ("gemm".to_owned(), object)),
        nvrtc().prop_map(|object| ("nvrtc".to_owned(), object)),
    ]
    .prop_flat_map(|(op, object)| {
        let order: Vec<usize> = (0..object.len()).collect();
        (Just(op), Just(object), Just(order).prop_shuffle())
    })
}

/// Runs `test` on generated cases (PROPTEST_CASES of them) and then fails unless at least a
/// quarter were accepted (`test` returned true): the generators make mostly valid fields
/// (about 40% of nvrtc problems come out valid as a whole), and a canonicaliser that refused
/// everything would otherwise pass every property.
fn run_mostly_accepted<S: Strategy>(
    strategy: S,
    test: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) {
    let (cases, accepted) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::default());
    let outcome = runner.run(&strategy, |value| {
        cases.fetch_add(1, Ordering::Relaxed);
        if test(value)? {
            accepted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let (cases, accepted) = (cases.into_inner(), accepted.into_inner());
    assert!(
        accepted * 4 >= cases,
        "only {accepted} of {cases} generated problems were accepted"
    );
}

#[test]
fn canonical_text_is_a_fixed_point_whatever_the_member_order() {
    run_mostly_accepted(shuffled_object(), |(op, object, order)| {
        let in_order: Vec<usize> = (0..object.len()).collect();
        let first = check_canonical(&op, &text_in_order(&object, &in_order))?;
        let second = check_canonical(&op, &text_in_order(&object, &order))?;
        prop_assert_eq!(&first, &second);
        Ok(first.is_some())
    });
}

#[test]
fn buffer_and_candidate_order_do_not_change_the_key() {
    run_mostly_accepted((nvrtc(), any::<prop::sample::Index>()), |(object, seed)| {
        let Some(canonical) = check_canonical("nvrtc", &Value::Object(object.clone()).to_string())?
        else {
            return Ok(false);
        };
        let mut reordered = object;
        for list in ["buffers", "candidates"] {
            if let Some(Value::Array(items)) = reordered.get_mut(list) {
                let len = items.len();
                if len > 1 {
                    items.rotate_left(seed.index(len));
                }
            }
        }
        let again = canonicalize("nvrtc", &Value::Object(reordered).to_string());
        prop_assert_eq!(again, Ok(canonical));
        Ok(true)
    });
}

proptest! {
    #[test]
    fn canonicaliser_survives_token_soup(
        op in prop::sample::select(vec!["gemm", "nvrtc", "other", ""]),
        text in r#"(\{|\}|\[|\]|:|,|"m"|"n"|"k"|"dtype"|"layout"|"f16"|"nn"|"source"|"kernel"|"buffers"|"args"|"candidates"|"check"|"name"|"grid"|"block"|"f32"|"i32"|"buffer"|[0-9.eE+-]{1,6}|null|true|" ?[a-z]{0,3}"| ){0,40}"#
    ) {
        check_canonical(op, &text)?;
    }

    #[test]
    fn canonicaliser_survives_any_text(op in "\\PC{0,6}", text in "\\PC{0,120}") {
        let _ = canonicalize(&op, &text);
        check_canonical(if op == "gemm" || op == "nvrtc" { &op } else { "gemm" }, &text)?;
    }
}

/// Found by the targets above: with serde_json's default float parser (the daemon built on
/// its own, without the benchmarks in the same cargo run) these floats came back an ulp off,
/// so canonical text was not a fixed point and one problem could get two keys. Fixed by the
/// workspace-wide `float_roundtrip` feature.
#[test]
fn canonical_floats_read_back_to_the_same_text() {
    for (atol, expected_sum) in [
        (
            5.758_173_273_713_150_5e-28_f64,
            3.402_823_466_385_288_6e38_f64,
        ),
        (3.632_197_849_394_605_3e-38, 0.0),
    ] {
        let problem = json!({
            "source": "extern \"C\" __global__ void k(float* y) { y[0] = 1; }",
            "kernel": "k",
            "buffers": [{"name": "y", "dtype": "f32", "len": 1}],
            "args": [{"buffer": "y"}, {"f32": 3.402_823_466_385_288_6e38}],
            "candidates": [{"name": "a", "grid": [1], "block": [1]}],
            "check": {"buffer": "y", "expected_sum": expected_sum, "atol": atol},
        });
        let canonical = canonicalize("nvrtc", &problem.to_string()).expect("valid problem");
        assert_eq!(canonicalize("nvrtc", &canonical), Ok(canonical.clone()));
        let parsed = parse_nvrtc(&canonical).expect("canonical parses");
        let check = parsed.check.expect("check");
        assert_eq!(check.atol.to_bits(), atol.to_bits());
        assert_eq!(
            check.expected_sum.map(f64::to_bits),
            Some(expected_sum.to_bits())
        );
    }
}

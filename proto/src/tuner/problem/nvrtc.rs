//! Op `nvrtc`: parsing and validating a kernel source with its buffers, arguments,
//! candidates and check, and putting them in canonical order.

use std::collections::BTreeMap;

use serde_json::Value;

use super::fields::{check_identifier, parse_object, Fields};
use super::types::{
    BufferDtype, BufferInit, BufferSpec, CandidateSpec, CheckSpec, KernelArg, NvrtcProblem,
};
use super::{
    ProblemError, MAX_BUFFER_ELEMS, MAX_CANDIDATES, MAX_SHARED_MEM_BYTES, MAX_SOURCE_BYTES,
    MAX_TOTAL_BUFFER_BYTES,
};

/// Parses and validates an nvrtc problem.
pub fn parse_nvrtc(problem: &str) -> Result<NvrtcProblem, ProblemError> {
    let root = parse_object(problem)?;
    let obj = Fields::new(&root, "")?;
    obj.only(&["source", "kernel", "buffers", "args", "candidates", "check"])?;

    let source = obj.string("source")?;
    if source.is_empty() || source.len() > MAX_SOURCE_BYTES {
        return Err(ProblemError::invalid(
            "source",
            format!("must be 1..={MAX_SOURCE_BYTES} bytes"),
        ));
    }
    if source.contains('\0') {
        return Err(ProblemError::invalid("source", "contains a NUL byte"));
    }
    let kernel = obj.string("kernel")?;
    check_identifier("kernel", kernel)?;

    let buffers = parse_buffers(&obj)?;
    let buffer_names: Vec<&str> = buffers.iter().map(|b| b.name.as_str()).collect();
    let args = parse_args(&obj, &buffer_names)?;
    let candidates = parse_candidates(&obj)?;
    let check = parse_check(&obj, &buffer_names, &candidates)?;

    Ok(NvrtcProblem {
        source: source.to_string(),
        kernel: kernel.to_string(),
        buffers,
        args,
        candidates,
        check,
    })
}

/// `buffers`: each validated, the total bounded, sorted by name, names unique.
fn parse_buffers(obj: &Fields<'_>) -> Result<Vec<BufferSpec>, ProblemError> {
    let mut buffers = Vec::new();
    let mut total_bytes: u64 = 0;
    for (i, item) in obj.array("buffers", 1, 64)?.iter().enumerate() {
        let path = format!("buffers[{i}]");
        let b = Fields::new(item, &path)?;
        b.only(&["name", "dtype", "len", "init"])?;
        let name = b.string("name")?;
        check_identifier(&b.path("name"), name)?;
        let dtype = match b.string("dtype")? {
            "f32" => BufferDtype::F32,
            "f16" => BufferDtype::F16,
            "bf16" => BufferDtype::Bf16,
            "i32" => BufferDtype::I32,
            "u32" => BufferDtype::U32,
            other => {
                return Err(ProblemError::invalid(
                    b.path("dtype"),
                    format!("{other:?} is not one of \"f32\", \"f16\", \"bf16\", \"i32\", \"u32\""),
                ))
            }
        };
        let len = b.uint("len", 1, MAX_BUFFER_ELEMS)?;
        let init = match b.optional_string("init")?.unwrap_or("random") {
            "zeros" => BufferInit::Zeros,
            "ones" => BufferInit::Ones,
            "random" => BufferInit::Random,
            other => {
                return Err(ProblemError::invalid(
                    b.path("init"),
                    format!("{other:?} is not one of \"zeros\", \"ones\", \"random\""),
                ))
            }
        };
        total_bytes += len * dtype.size_bytes();
        if total_bytes > MAX_TOTAL_BUFFER_BYTES {
            return Err(ProblemError::invalid(
                "buffers",
                format!("more than {MAX_TOTAL_BUFFER_BYTES} bytes in total"),
            ));
        }
        buffers.push(BufferSpec {
            name: name.to_string(),
            dtype,
            len,
            init,
        });
    }
    buffers.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = buffers.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ProblemError::invalid(
            "buffers",
            format!("name {:?} is used twice", pair[0].name),
        ));
    }
    Ok(buffers)
}

/// `args`: positional, each exactly one typed value or a buffer of `buffer_names`.
fn parse_args(obj: &Fields<'_>, buffer_names: &[&str]) -> Result<Vec<KernelArg>, ProblemError> {
    let mut args = Vec::new();
    for (i, item) in obj.array("args", 0, 64)?.iter().enumerate() {
        let path = format!("args[{i}]");
        let a = Fields::new(item, &path)?;
        if a.map.len() != 1 {
            return Err(ProblemError::invalid(
                &path,
                "must have exactly one of buffer, i32, u32, i64, u64, f32",
            ));
        }
        a.only(&["buffer", "i32", "u32", "i64", "u64", "f32"])?;
        let arg = if a.map.contains_key("buffer") {
            let name = a.string("buffer")?;
            if !buffer_names.contains(&name) {
                return Err(ProblemError::invalid(
                    a.path("buffer"),
                    format!("no buffer named {name:?}"),
                ));
            }
            KernelArg::Buffer(name.to_string())
        } else if a.map.contains_key("i32") {
            KernelArg::I32(a.int("i32", i32::MIN.into(), i32::MAX.into())? as i32)
        } else if a.map.contains_key("u32") {
            KernelArg::U32(a.uint("u32", 0, u32::MAX.into())? as u32)
        } else if a.map.contains_key("i64") {
            KernelArg::I64(a.int("i64", i64::MIN, i64::MAX)?)
        } else if a.map.contains_key("u64") {
            KernelArg::U64(a.uint("u64", 0, u64::MAX)?)
        } else {
            KernelArg::F32(a.float32("f32")?)
        };
        args.push(arg);
    }
    Ok(args)
}

/// `candidates`: each validated with defaults filled in, sorted by name, names unique.
fn parse_candidates(obj: &Fields<'_>) -> Result<Vec<CandidateSpec>, ProblemError> {
    let mut candidates = Vec::new();
    for (i, item) in obj
        .array("candidates", 1, MAX_CANDIDATES)?
        .iter()
        .enumerate()
    {
        let path = format!("candidates[{i}]");
        let c = Fields::new(item, &path)?;
        c.only(&["name", "defines", "grid", "block", "shared_mem_bytes"])?;
        let name = c.string("name")?;
        if name.is_empty() || name.len() > 64 || name.chars().any(|ch| ch.is_control()) {
            return Err(ProblemError::invalid(
                c.path("name"),
                "must be 1..=64 printable characters",
            ));
        }
        let mut defines = BTreeMap::new();
        if let Some(value) = c.map.get("defines") {
            let defs = Fields::new(value, &c.path("defines"))?;
            for (macro_name, macro_value) in defs.map {
                let field = defs.path(macro_name);
                check_identifier(&field, macro_name)?;
                let text = macro_value
                    .as_str()
                    .ok_or_else(|| ProblemError::invalid(&field, "must be a string"))?;
                if text.len() > 256 || text.chars().any(|ch| ch.is_control()) {
                    return Err(ProblemError::invalid(
                        &field,
                        "must be at most 256 characters without control characters",
                    ));
                }
                defines.insert(macro_name.clone(), text.to_string());
            }
        }
        let grid = c.dims("grid", [u32::MAX >> 1, 65_535, 65_535])?;
        let block = c.dims("block", [1024, 1024, 64])?;
        let threads: u64 = block.iter().map(|&d| u64::from(d)).product();
        if threads > 1024 {
            return Err(ProblemError::invalid(
                c.path("block"),
                format!("{threads} threads per block (at most 1024)"),
            ));
        }
        let shared_mem_bytes = c.optional_uint("shared_mem_bytes", 0, MAX_SHARED_MEM_BYTES)?;
        candidates.push(CandidateSpec {
            name: name.to_string(),
            defines,
            grid,
            block,
            shared_mem_bytes: shared_mem_bytes.unwrap_or(0) as u32,
        });
    }
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = candidates.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ProblemError::invalid(
            "candidates",
            format!("name {:?} is used twice", pair[0].name),
        ));
    }
    Ok(candidates)
}

/// `check`, if given: a buffer of `buffer_names`, and a reference among `candidates` and/or
/// an expected sum, with its tolerances.
fn parse_check(
    obj: &Fields<'_>,
    buffer_names: &[&str],
    candidates: &[CandidateSpec],
) -> Result<Option<CheckSpec>, ProblemError> {
    Ok(match obj.map.get("check") {
        None | Some(Value::Null) => None,
        Some(value) => {
            let c = Fields::new(value, "check")?;
            c.only(&["buffer", "reference", "expected_sum", "rtol", "atol"])?;
            let buffer = c.string("buffer")?;
            if !buffer_names.contains(&buffer) {
                return Err(ProblemError::invalid(
                    c.path("buffer"),
                    format!("no buffer named {buffer:?}"),
                ));
            }
            let reference = c.optional_string("reference")?;
            if let Some(reference) = reference {
                if !candidates.iter().any(|cand| cand.name == reference) {
                    return Err(ProblemError::invalid(
                        c.path("reference"),
                        format!("no candidate named {reference:?}"),
                    ));
                }
            }
            let expected_sum = c.optional_float("expected_sum")?;
            if reference.is_none() && expected_sum.is_none() {
                return Err(ProblemError::Missing {
                    field: c.path("reference"),
                });
            }
            let rtol = c.optional_float("rtol")?.unwrap_or(1e-3);
            let atol = c.optional_float("atol")?.unwrap_or(1e-3);
            for (field, tol) in [("rtol", rtol), ("atol", atol)] {
                if tol < 0.0 {
                    return Err(ProblemError::invalid(c.path(field), "must be >= 0"));
                }
            }
            Some(CheckSpec {
                buffer: buffer.to_string(),
                reference: reference.map(str::to_string),
                expected_sum,
                rtol,
                atol,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::canonicalize;
    use super::*;

    const NVRTC: &str = r#"{
        "source": "extern \"C\" __global__ void scale(float* y, const float* x, int n) { int i = blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }",
        "kernel": "scale",
        "buffers": [{"name":"y","dtype":"f32","len":1024,"init":"zeros"},{"name":"x","dtype":"f32","len":1024}],
        "args": [{"buffer":"y"},{"buffer":"x"},{"i32":1024}],
        "candidates": [
            {"name":"b256","defines":{"BLOCK":"256"},"grid":[4],"block":[256]},
            {"name":"b128","defines":{"BLOCK":"128","UNUSED":""},"grid":[8,1],"block":[128,1,1],"shared_mem_bytes":0}
        ],
        "check": {"buffer":"y","reference":"b128"}
    }"#;

    #[test]
    fn nvrtc_canonical_form_sorts_and_fills_defaults() {
        let text = canonicalize("nvrtc", NVRTC).unwrap();
        let reordered = NVRTC.replace(
            r#"{"name":"b256","defines":{"BLOCK":"256"},"grid":[4],"block":[256]},"#,
            "",
        );
        let reordered = reordered.replace(
            r#""shared_mem_bytes":0}"#,
            r#""shared_mem_bytes":0},{"block":[256,1,1],"grid":[4,1,1],"name":"b256","defines":{"BLOCK":"256"}}"#,
        );
        assert_eq!(canonicalize("nvrtc", &reordered).unwrap(), text);
        let parsed = parse_nvrtc(&text).unwrap();
        assert_eq!(parsed.candidates[0].name, "b128");
        assert_eq!(parsed.candidates[1].grid, [4, 1, 1]);
        assert_eq!(parsed.buffers[0].name, "x");
        assert_eq!(parsed.buffers[0].init, BufferInit::Random);
        let check = parsed.check.unwrap();
        assert_eq!((check.rtol, check.atol), (1e-3, 1e-3));
        assert_eq!(canonicalize("nvrtc", &text).unwrap(), text);
    }

    #[test]
    fn each_malformed_nvrtc_field_is_named() {
        let cases = [
            (r#""kernel": "scale""#, r#""kernel": "sca le""#, "kernel"),
            (r#""kernel": "scale","#, "", "kernel"),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f64","len":1024}"#,
                "buffers[1].dtype",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f32","len":0}"#,
                "buffers[1].len",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"x","dtype":"f32","len":4,"init":"iota"}"#,
                "buffers[1].init",
            ),
            (
                r#"{"name":"x","dtype":"f32","len":1024}"#,
                r#"{"name":"y","dtype":"f32","len":1024}"#,
                "buffers",
            ),
            (r#"{"buffer":"x"}"#, r#"{"buffer":"z"}"#, "args[1].buffer"),
            (r#"{"i32":1024}"#, r#"{"i32":4294967296}"#, "args[2].i32"),
            (r#"{"i32":1024}"#, r#"{"i16":3}"#, "args[2].i16"),
            (r#""grid":[4]"#, r#""grid":[0]"#, "candidates[0].grid"),
            (
                r#""block":[256]"#,
                r#""block":[256,8]"#,
                "candidates[0].block",
            ),
            (
                r#""BLOCK":"256""#,
                r#""BLOCK SIZE":"256""#,
                "candidates[0].defines.BLOCK SIZE",
            ),
            (
                r#""shared_mem_bytes":0"#,
                r#""shared_mem_bytes":1000000"#,
                "candidates[1].shared_mem_bytes",
            ),
            (r#""name":"b256""#, r#""name":"b128""#, "candidates"),
            (
                r#""reference":"b128""#,
                r#""reference":"b512""#,
                "check.reference",
            ),
            (r#""reference":"b128""#, r#""rtol":0.1"#, "check.reference"),
            (
                r#""check": {"buffer":"y""#,
                r#""check": {"buffer":"w""#,
                "check.buffer",
            ),
        ];
        for (from, to, field) in cases {
            let problem = NVRTC.replacen(from, to, 1);
            assert_ne!(problem, NVRTC, "replacement {from} did not apply");
            let err = canonicalize("nvrtc", &problem).expect_err(to);
            assert_eq!(err.field(), Some(field), "{to}: {err}");
        }
    }
}

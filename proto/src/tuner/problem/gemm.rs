//! Op `gemm`: parsing and validating `{"m", "n", "k", "dtype", "layout"}`.

use super::fields::{parse_object, Fields};
use super::types::{GemmDtype, GemmLayout, GemmProblem};
use super::{ProblemError, MAX_GEMM_DIM, MAX_GEMM_OPERAND_ELEMS};

/// Parses and validates a gemm problem.
pub fn parse_gemm(problem: &str) -> Result<GemmProblem, ProblemError> {
    let root = parse_object(problem)?;
    let obj = Fields::new(&root, "")?;
    obj.only(&["m", "n", "k", "dtype", "layout"])?;
    let m = obj.uint("m", 1, MAX_GEMM_DIM)?;
    let n = obj.uint("n", 1, MAX_GEMM_DIM)?;
    let k = obj.uint("k", 1, MAX_GEMM_DIM)?;
    let dtype = match obj.string("dtype")? {
        "f16" => GemmDtype::F16,
        "bf16" => GemmDtype::Bf16,
        "f32" => GemmDtype::F32,
        other => {
            return Err(ProblemError::invalid(
                "dtype",
                format!("{other:?} is not one of \"f16\", \"bf16\", \"f32\""),
            ))
        }
    };
    let layout = match obj.string("layout")? {
        "nn" => GemmLayout::Nn,
        "nt" => GemmLayout::Nt,
        "tn" => GemmLayout::Tn,
        "tt" => GemmLayout::Tt,
        other => {
            return Err(ProblemError::invalid(
                "layout",
                format!("{other:?} is not one of \"nn\", \"nt\", \"tn\", \"tt\""),
            ))
        }
    };
    for (field, elems) in [("m", m * k), ("n", k * n), ("m", m * n)] {
        if elems > MAX_GEMM_OPERAND_ELEMS {
            return Err(ProblemError::invalid(
                field,
                format!(
                    "an operand would have {elems} elements (at most {MAX_GEMM_OPERAND_ELEMS})"
                ),
            ));
        }
    }
    Ok(GemmProblem {
        m,
        n,
        k,
        dtype,
        layout,
    })
}

#[cfg(test)]
mod tests {
    use super::super::canonicalize;

    fn gemm_field_error(problem: &str) -> String {
        let err = canonicalize("gemm", problem).expect_err(problem);
        err.field()
            .unwrap_or_else(|| panic!("{err} names no field"))
            .to_string()
    }

    #[test]
    fn equal_gemm_problems_give_equal_text() {
        let a = canonicalize(
            "gemm",
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nt"}"#,
        );
        let b = canonicalize(
            "gemm",
            r#" { "layout" : "nt", "dtype":"f16", "k":32, "n": 64, "m":128 } "#,
        );
        assert_eq!(a, b);
        assert_eq!(
            a.unwrap(),
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nt"}"#
        );
        let c = canonicalize(
            "gemm",
            r#"{"m":128,"n":64,"k":32,"dtype":"f16","layout":"nn"}"#,
        );
        assert_ne!(c.unwrap(), b.unwrap());
    }

    #[test]
    fn canonical_gemm_text_is_a_fixed_point() {
        let once = canonicalize(
            "gemm",
            r#"{"k":7,"m":5,"n":3,"dtype":"bf16","layout":"tt"}"#,
        )
        .unwrap();
        assert_eq!(canonicalize("gemm", &once).unwrap(), once);
    }

    #[test]
    fn each_malformed_gemm_field_is_named() {
        let cases = [
            (r#"{"n":1,"k":1,"dtype":"f32","layout":"nn"}"#, "m"),
            (r#"{"m":0,"n":1,"k":1,"dtype":"f32","layout":"nn"}"#, "m"),
            (r#"{"m":1,"n":-4,"k":1,"dtype":"f32","layout":"nn"}"#, "n"),
            (r#"{"m":1,"n":1,"k":1.5,"dtype":"f32","layout":"nn"}"#, "k"),
            (r#"{"m":1,"n":1,"k":"8","dtype":"f32","layout":"nn"}"#, "k"),
            (
                r#"{"m":1,"n":1,"k":65537,"dtype":"f32","layout":"nn"}"#,
                "k",
            ),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f64","layout":"nn"}"#,
                "dtype",
            ),
            (r#"{"m":1,"n":1,"k":1,"layout":"nn"}"#, "dtype"),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f32","layout":"NN"}"#,
                "layout",
            ),
            (
                r#"{"m":1,"n":1,"k":1,"dtype":"f32","layout":"nn","alpha":2}"#,
                "alpha",
            ),
            (
                r#"{"m":65536,"n":65536,"k":1,"dtype":"f32","layout":"nn"}"#,
                "m",
            ),
        ];
        for (problem, field) in cases {
            assert_eq!(gemm_field_error(problem), field, "{problem}");
        }
    }
}

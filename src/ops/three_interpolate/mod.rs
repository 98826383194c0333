//! The three-interpolate family (PointNet++ feature propagation): ThreeInterpolate, the
//! forward partner (CPU), and ThreeInterpolateBackward (CPU and BANG kernels).

pub mod backward;
pub mod bang;
pub mod forward;
pub mod mluops;

crate::mlu::kernel_abi!("three_interpolate");
mod lanes;
mod real;

use real::Real;

pub use backward::ThreeInterpolateBackward;
pub use forward::ThreeInterpolate;

use crate::error::{Error, Result};
use crate::ops::rules::{Broken, Check, RowValues, ValueRule};
use crate::tensor::{DType, Inputs};

/// Validated sizes of either operator (features or grad_features [B, C, M], indices and
/// weights [B, N, 3], output or grad_output [B, C, N]) and the element type T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    b: usize,
    c: usize,
    m: usize,
    n: usize,
    dtype: DType,
}

/// The inputs `indices` and `weights`, at the same place in both operators.
const INDICES: usize = 1;
const WEIGHTS: usize = 2;

/// The element type T of input `i`: float32 or float16, else the contract error.
fn float_dtype(inputs: &Inputs<'_>, i: usize) -> Result<DType> {
    match inputs.dtype(i) {
        Some(t @ (DType::F32 | DType::F16)) => Ok(t),
        Some(other) => Err(inputs.error(
            i,
            format!("expected dtype tensor(float) or tensor(float16), got {}", other.onnx_name()),
        )),
        None => Err(inputs.error(i, "required input is missing")),
    }
}

/// The value rule of `indices` ([B, n, 3], input 1 of both operators): every value in [0, m).
fn indices_rule(m: usize) -> ValueRule {
    let (lo, hi) = Check::half_open(0, m);
    ValueRule::whole(INDICES, Check::int_range(lo, hi))
}

/// The contract error of [`indices_rule`]; `m_name` says where m comes from.
fn indices_error(inputs: &Inputs<'_>, n: usize, m: usize, m_name: &str, broken: &Broken) -> Error {
    let (bn, k) = (broken.row / 3, broken.row % 3);
    let (b, n) = (bn / n.max(1), bn % n.max(1));
    let value = match &broken.values {
        RowValues::I32(v) => v.first().map_or(String::new(), i32::to_string),
        RowValues::F32(v) => format!("{v:?}"),
    };
    inputs.error(
        INDICES,
        format!("indices[{b}, {n}, {k}] = {value} is outside [0, {m_name}) with {m_name} = {m}"),
    )
}

//! The contract's rules, split as the two paths need them. Shape rules read attributes,
//! input dtypes and shapes, and the few inputs whose values are sizes (DynamicScatterBackward's
//! `voxel_num`, PsRoiPoolBackward's `bottom_shape`); both paths run them on the host. Value
//! rules, the rules on index values, are data ([`ValueRule`]): the CPU path checks them on
//! the host ([`check_values`]), the MLU path on the card (kernels/check, through
//! `ops::device`), and both report the first broken row through the operator's
//! [`Operator::describe`], so the two paths give the same error text. Each operator states
//! its rules in its [`Operator`] impl; this module holds the value rules' data and the
//! host's checks.

use super::operator::Operator;
use crate::error::Result;
use crate::tensor::Inputs;

/// What a value rule requires of the rows of one input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// int32 rows of `cols` values (at most 4): each within its column's inclusive bounds.
    Int { cols: usize, bounds: [(i32, i32); 4] },
    /// float32 rows of `cols` values: in every row whose values are all finite,
    /// `above < row[col] < below`.
    GuardedFloat { cols: usize, col: usize, above: f32, below: f32 },
}

impl Check {
    /// One inclusive range for every value of a flat int32 input.
    pub fn int_range(lo: i32, hi: i32) -> Self {
        Check::Int { cols: 1, bounds: [(lo, hi); 4] }
    }

    /// The inclusive int32 bounds of `[lo, end)` (`end` clamped to the int32 range; an empty
    /// range gives hi < lo).
    pub fn half_open(lo: i32, end: usize) -> (i32, i32) {
        (lo, i32::try_from(end).map_or(i32::MAX, |e| e - 1))
    }

    pub fn cols(&self) -> usize {
        match *self {
            Check::Int { cols, .. } | Check::GuardedFloat { cols, .. } => cols,
        }
    }

    /// The strictest float bound `below` for "truncated value < `n`": the least float32
    /// >= n, so that for every float x, x < below exactly when x < n.
    pub fn float_below(n: usize) -> f32 {
        let f = n as f32;
        if (f as f64) < n as f64 { f.next_up() } else { f }
    }
}

/// A contract rule on the values of input `input`, or of the elements `part` = (first,
/// count) of it (`first` a multiple of the check's columns; rows are counted from `first`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueRule {
    pub input: usize,
    pub part: Option<(usize, usize)>,
    pub check: Check,
}

impl ValueRule {
    /// `check` on every value of input `input`.
    pub fn whole(input: usize, check: Check) -> Self {
        ValueRule { input, part: None, check }
    }

    /// `check` on `count` elements of input `input` from element `first`.
    pub fn part(input: usize, first: usize, count: usize, check: Check) -> Self {
        ValueRule { input, part: Some((first, count)), check }
    }

    /// The elements the rule covers, of an input of `numel` (empty when the part lies
    /// outside it, which the shape rules exclude).
    pub fn elements(&self, numel: usize) -> std::ops::Range<usize> {
        match self.part {
            None => 0..numel,
            Some((first, count)) => first.min(numel)..first.saturating_add(count).min(numel),
        }
    }
}

/// The values of the row that broke a rule.
#[derive(Debug, Clone, PartialEq)]
pub enum RowValues {
    I32(Vec<i32>),
    F32(Vec<f32>),
}

/// The first row that broke a rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Broken {
    /// Index into the operator's [`Operator::value_rules`].
    pub rule: usize,
    pub row: usize,
    pub values: RowValues,
}

/// The most bytes of a size input the card path reads (PsRoiPoolBackward's `bottom_shape`: 4
/// int64; IndiceConv's `indice_num`: one int32 per kernel offset, up to 4096 offsets). A
/// larger one is not read: the node then runs its CPU kernel.
pub const SIZE_INPUT_BYTES: usize = 16 * 1024;

/// The first row of `data` that breaks `check`, if any (the host's version of kernels/check).
fn first_broken_int(data: &[i32], cols: usize, bounds: &[(i32, i32); 4]) -> Option<usize> {
    data.chunks_exact(cols)
        .position(|row| row.iter().zip(bounds).any(|(&v, &(lo, hi))| v < lo || v > hi))
}

pub(super) fn first_broken_float(
    data: &[f32],
    cols: usize,
    col: usize,
    above: f32,
    below: f32,
) -> Option<usize> {
    data.chunks_exact(cols).position(|row| {
        row.iter().all(|v| v.is_finite()) && !(row[col] > above && row[col] < below)
    })
}

/// Checks the value rules on host data (the CPU path), in order; the first broken one is
/// the error.
pub fn check_values<O: Operator>(op: &O, inputs: &Inputs<'_>, dims: &O::Dims) -> Result<()> {
    for (rule, r) in op.value_rules(dims).iter().enumerate() {
        let broken = match r.check {
            Check::Int { cols, bounds } => {
                let data = inputs.get::<i32>(r.input)?.data;
                let data = &data[r.elements(data.len())];
                first_broken_int(data, cols, &bounds)
                    .map(|row| (row, RowValues::I32(data[row * cols..(row + 1) * cols].to_vec())))
            }
            Check::GuardedFloat { cols, col, above, below } => {
                let data = inputs.get::<f32>(r.input)?.data;
                let data = &data[r.elements(data.len())];
                first_broken_float(data, cols, col, above, below)
                    .map(|row| (row, RowValues::F32(data[row * cols..(row + 1) * cols].to_vec())))
            }
        };
        if let Some((row, values)) = broken {
            return Err(op.describe(inputs, dims, &Broken { rule, row, values }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_below_is_exact_for_sizes_floats_cannot_hold() {
        assert_eq!(Check::float_below(3), 3.0);
        let n = (1usize << 24) + 1;
        let below = Check::float_below(n);
        assert!(((1u32 << 24) as f32) < below);
        assert_eq!(below as f64, n as f64 + 1.0);
    }

    #[test]
    fn hosts_checks_find_the_first_broken_row() {
        let b = [(0, 3), (0, 9), (0, 9), (0, 9)];
        assert_eq!(first_broken_int(&[0, 1, 2, 3, 3, 9, 9, 9, 4, 0, 0, 0], 4, &b), Some(2));
        assert_eq!(first_broken_int(&[0, 1, 2, 3], 4, &b), None);
        let nan = f32::NAN;
        let rows = [5.0, 0.0, 1.0, nan, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(first_broken_float(&rows, 5, 0, -1.0, 2.0), Some(2));
        assert_eq!(Check::half_open(0, 0), (0, -1));
        assert_eq!(Check::half_open(-1, 1usize << 40), (-1, i32::MAX));
    }
}

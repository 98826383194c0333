//! GetIndicePairs (docs/CONTRACT.md §4): the rulebook of a 3D sparse convolution
//! (spconv v1 `get_indice_pairs`, MLU-OPS `mluopGetIndicePairs`).
//!
//! Every site (batch, z, y, x) is packed into one integer key, field after field with just
//! enough bits for the largest value, so integer order is (batch, z, y, x) order. `u64`
//! keys when the fields fit, `u128` otherwise (each field is at most 31 bits). Memory
//! depends on the spatial volume only where step 2's bitmap is used, and that is bounded
//! by the pairs the rows can emit (below).
//!
//! Conv / transpose (`plan`, on the node's thread pool: the output site count is the output
//! shape, so this is where most of the work is):
//! 1. Blocks of consecutive input rows, in parallel: for each row, per axis, list the
//!    (kernel tap, output coordinate) pairs that the contract's formula accepts (at most k per
//!    axis), and emit the cross product as (row, output key) into one bucket per kernel
//!    offset. Rows are visited in order, so each block's buckets, taken block after block,
//!    are ascending by input row. Unless the sites go to a bitmap (step 2), each block also
//!    keeps a copy of its keys grouped by key prefix (a counting sort), so that step 2 reads
//!    every key once.
//! 2. When the output grid's bitmap is small (at most a quarter of a 64-bit word per pair
//!    the rows can emit, L times the taps a row reaches per axis, or 32 KB), step 1 marks
//!    each emitted site in it instead (one atomic OR per new site) and emits the site's
//!    grid index as its key: the set bits in order are the sorted unique sites, and a
//!    site's position is the count of set bits before its word (kept per word) plus those
//!    below it: no sort, no search. Otherwise the key space is cut at key prefixes into
//!    ranges of about equal emitted counts; each range gathers its prefixes' groups from
//!    every block, then LSD radix sorts and deduplicates them, in parallel. The ranges in
//!    order are the sorted unique output sites, whatever the cut. The grouped copies are
//!    dropped before `execute`.
//!
//! `execute` (parallel, one task per kernel offset) looks every emitted key up in the unique
//! sites (in the bitmap, or in the sorted keys, where a table of key prefixes, about one
//! per site, narrows each binary search to a key or two).
//!
//! Subm: `plan` radix-sorts (key, row) and rejects duplicates. `execute` runs one task per
//! (kz, ky): it walks the sorted sites once, and for each site searches the x window of its
//! target line (b, z + dz, y + dy), that line's key computed once per source line (per site
//! with dilation > 1 on x). Those windows start at keys that increase with the source key,
//! so one forward pointer serves every site (a merge join, no hashing; with dilation > 1 on
//! x, one pointer per x tap). Hits go to `indice_pairs[k, 1, row]`, which is then compacted
//! in row order. Nothing depends on how tasks are scheduled.
//!
//! Cost: O(L * (kd + kh + kw) + P) for conv with P pairs, O(L * K) for subm; memory O(P)
//! (plus the bitmap: at most 3 bytes per pair the rows can emit, or 48 KB) or O(L) beyond
//! the outputs.

use crate::ops::Operator;
use crate::error::{Error, Result};
use crate::ops::rules::{Broken, Check, RowValues, Rules, ValueRule, check_values};
use crate::parallel::{Parallel, balanced_cuts, for_each_chunk_mut, pieces};
use crate::schema::Attrs;
use crate::scratch::{self, FirstError};
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

mod keys;
pub mod mlu;
pub mod mluops;
mod rulebook;

use keys::Layout;
use rulebook::{ConvBook, SubmBook, write_conv, write_subm};

/// Spatial dimensions (the seed's `dimNb`).
pub const DIM_NB: usize = 3;
/// Largest kernel volume K the contract accepts.
pub const MAX_KERNEL_VOLUME: usize = 4096;
/// Axis names in messages, in attribute order.
const AXIS: [&str; DIM_NB] = ["0 (D, z)", "1 (H, y)", "2 (W, x)"];
pub(super) const INDICES: usize = 0;
/// Output rows decoded per task.
const GRAIN: usize = 64 * 1024;
/// Input rows per emission task of a conv rulebook.
const EMIT_ROWS: usize = 32 * 1024;
/// Emitted keys per sorting task of a conv rulebook.
const SORT_KEYS: usize = 256 * 1024;
/// Smallest output-grid bitmap always allowed (32 KB), however few the pairs.
const DENSE_MIN_WORDS: usize = 4096;
/// Bits of the key prefix at which the sort is cut between tasks.
const SPLIT_BITS: u32 = 12;
/// Pairs ahead of a site lookup that its table entry (twice this) and keys are prefetched.
const LOOKUP_AHEAD: usize = 8;

/// The sparse-convolution descriptor (the seed's `mluOpSparseConvolutionStruct`), validated.
/// Per-axis arrays are in (D, H, W) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetIndicePairs {
    pub batch: i64,
    pub pad: [i64; DIM_NB],
    pub stride: [i64; DIM_NB],
    pub dilation: [i64; DIM_NB],
    pub input_space: [i64; DIM_NB],
    pub filter_space: [i64; DIM_NB],
    /// Computed from the other fields; every value is in [1, i32::MAX].
    pub output_space: [i64; DIM_NB],
    pub output_padding: [i64; DIM_NB],
    pub sub_m: bool,
    pub transpose: bool,
    /// Always false: the contract rejects inverse != 0.
    pub inverse: bool,
}

fn attr_err(name: &str, rule: impl Into<String>) -> Error {
    Error::attribute(name, rule)
}

/// Checks every value of a per-axis attribute against `ok` ("expected `what`").
fn each_axis(name: &str, v: &[i64; DIM_NB], what: &str, ok: impl Fn(i64) -> bool) -> Result<()> {
    match (0..DIM_NB).find(|&a| !ok(v[a])) {
        Some(a) => Err(attr_err(name, format!("expected every value {what}, got {} on axis {} in {v:?}", v[a], AXIS[a]))),
        None => Ok(()),
    }
}

/// A 0/1 flag attribute.
fn flag(attrs: &Attrs<'_>, name: &str) -> Result<bool> {
    match attrs.int(name)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(attr_err(name, format!("expected 0 or 1, got {v}"))),
    }
}

impl GetIndicePairs {
    /// K = kd * kh * kw (at most 4096 after validation).
    pub fn kernel_volume(&self) -> usize {
        self.filter_space.iter().map(|&k| k as usize).product()
    }

    /// Output size per axis, or the contract error. i128 arithmetic cannot overflow for any
    /// i64 attributes (every term is a product of at most two of them).
    fn output_size(&self, a: usize) -> Result<i64> {
        let (i, k, s, p, d, op) = (
            i128::from(self.input_space[a]),
            i128::from(self.filter_space[a]),
            i128::from(self.stride[a]),
            i128::from(self.pad[a]),
            i128::from(self.dilation[a]),
            i128::from(self.output_padding[a]),
        );
        let (out, formula, blame) = if self.transpose {
            let out = (i - 1) * s - 2 * p + d * (k - 1) + op + 1;
            let f = format!("transpose ({i} - 1) * {s} - 2 * {p} + {d} * ({k} - 1) + {op} + 1 = {out}");
            (out, f, "padding")
        } else {
            // Floor division: a negative numerator means the dilated kernel does not fit
            // in the padded input, i.e. no output position at all.
            let out = (i + 2 * p - d * (k - 1) - 1).div_euclid(s) + 1;
            let f = format!("floor(({i} + 2 * {p} - {d} * ({k} - 1) - 1) / {s}) + 1 = {out}");
            (out, f, "kernel_size")
        };
        if out <= 0 {
            let why = if self.transpose {
                "the padding removes every output position"
            } else {
                "the dilated kernel is larger than the padded input"
            };
            return Err(attr_err(
                blame,
                format!("output size on axis {} is {formula}: expected > 0 ({why})", AXIS[a]),
            ));
        }
        i64::try_from(out).ok().filter(|&o| o <= i64::from(i32::MAX)).ok_or_else(|| {
            attr_err(
                "spatial_shape",
                format!(
                    "output size on axis {} is {formula}: expected <= {} (out_indices holds int32 coordinates)",
                    AXIS[a],
                    i32::MAX
                ),
            )
        })
    }
}

enum Book {
    Conv64(ConvBook<u64>),
    Conv128(ConvBook<u128>),
    Subm64(SubmBook<u64>),
    Subm128(SubmBook<u128>),
}

/// What `plan` hands to `execute`: sizes and the rulebook (`None` when L = 0).
pub struct Plan {
    l: usize,
    k: usize,
    num_out: usize,
    book: Option<Book>,
}

/// Row `r` of the [L, 4] indices as (batch, z, y, x).
fn rows4(data: &[i32]) -> impl Iterator<Item = [i32; 4]> + '_ {
    data.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]])
}

impl GetIndicePairs {
    /// The shape and value rules (the CPU path), and the largest value of each column.
    pub(super) fn validate(&self, inputs: &Inputs<'_>) -> Result<(usize, usize, [u32; 4])> {
        let d = self.shape_rules(inputs)?;
        check_values(self, inputs, &d)?;
        let mut max = [0u32; 4];
        // Every value is in [0, limit) of its column (the value rule, checked above).
        for row in rows4(inputs.get::<i32>(INDICES)?.data) {
            for f in 0..4 {
                max[f] = max[f].max(row[f] as u32);
            }
        }
        Ok((d.l, d.k, max))
    }

}

/// The sizes GetIndicePairs' shape rules find: L input rows, K kernel offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GipDims {
    pub l: usize,
    pub k: usize,
}

impl Rules for GetIndicePairs {
    type Dims = GipDims;

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<GipDims> {
        let l = inputs.shaped::<i32>(INDICES, &[None, Some(4)], "[L, 4]")?[0];
        let k = self.kernel_volume();
        // Every element offset of indice_pairs (and so every row index, L * K and the
        // output count) must fit int32.
        let pairs_len = k.checked_mul(2).and_then(|n| n.checked_mul(l));
        if pairs_len.is_none_or(|n| n > i32::MAX as usize) {
            return Err(Error::output(
                "indice_pairs",
                format!("K * 2 * L = {k} * 2 * {l} elements exceed the int32 index range (max {})", i32::MAX),
            ));
        }
        Ok(GipDims { l, k })
    }

    /// Every row's batch in [0, batch_size) and z, y, x inside `spatial_shape`.
    fn value_rules(&self, _: &GipDims) -> Vec<ValueRule> {
        let limits = [self.batch, self.input_space[0], self.input_space[1], self.input_space[2]];
        let bounds = limits.map(|n| Check::half_open(0, usize::try_from(n).unwrap_or(0)));
        vec![ValueRule::whole(INDICES, Check::Int { cols: 4, bounds })]
    }

    fn describe(&self, inputs: &Inputs<'_>, _: &GipDims, broken: &Broken) -> Error {
        let r = broken.row;
        let RowValues::I32(row) = &broken.values else {
            return inputs.error(INDICES, format!("row {r} = {:?} breaks the coordinate rule", broken.values));
        };
        let limits = [self.batch, self.input_space[0], self.input_space[1], self.input_space[2]];
        let f = (0..4).find(|&f| row.get(f).is_some_and(|&v| v < 0 || i64::from(v) >= limits[f])).unwrap_or(0);
        let v = row.get(f).copied().unwrap_or(0);
        let what = match f {
            0 => format!("batch {v} is outside [0, batch_size = {})", self.batch),
            _ => format!(
                "coordinate {v} on axis {} is outside [0, {}) of spatial_shape {:?}",
                AXIS[f - 1],
                limits[f],
                self.input_space
            ),
        };
        inputs.error(INDICES, format!("row {r} = {row:?}: {what}"))
    }
}

impl Operator for GetIndicePairs {
    const NAME: &'static str = "GetIndicePairs";
    const SCHEMA: &'static str = include_str!("../../../../schemas/sparse_conv/get_indice_pairs.json");
    type Plan = Plan;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        let batch = attrs.int("batch_size")?;
        if batch <= 0 {
            return Err(attr_err("batch_size", format!("expected > 0, got {batch}")));
        }
        let input_space = attrs.ints_n::<DIM_NB>("spatial_shape")?;
        each_axis("spatial_shape", &input_space, "> 0", |v| v > 0)?;
        let filter_space = attrs.ints_n::<DIM_NB>("kernel_size")?;
        each_axis("kernel_size", &filter_space, "> 0", |v| v > 0)?;
        let volume = filter_space.iter().try_fold(1i64, |acc, &k| acc.checked_mul(k));
        if volume.is_none_or(|v| v > MAX_KERNEL_VOLUME as i64) {
            let shown = volume.map_or_else(|| "more than i64::MAX".to_owned(), |v| v.to_string());
            return Err(attr_err(
                "kernel_size",
                format!("expected K = kd * kh * kw <= {MAX_KERNEL_VOLUME}, got {filter_space:?}: K = {shown}"),
            ));
        }
        let stride = attrs.ints_n::<DIM_NB>("stride")?;
        each_axis("stride", &stride, "> 0", |v| v > 0)?;
        let pad = attrs.ints_n::<DIM_NB>("padding")?;
        each_axis("padding", &pad, ">= 0", |v| v >= 0)?;
        let dilation = attrs.ints_n::<DIM_NB>("dilation")?;
        each_axis("dilation", &dilation, "> 0", |v| v > 0)?;
        let output_padding = attrs.ints_n::<DIM_NB>("output_padding")?;
        each_axis("output_padding", &output_padding, ">= 0", |v| v >= 0)?;
        let sub_m = flag(attrs, "subm")?;
        let transpose = flag(attrs, "transpose")?;
        let inverse = attrs.int("inverse")?;
        if inverse != 0 {
            return Err(attr_err(
                "inverse",
                format!("expected 0 (an inverse convolution reuses the forward pairs), got {inverse}"),
            ));
        }
        if let Some(a) = (0..DIM_NB).find(|&a| stride[a] > 1 && dilation[a] > 1) {
            return Err(attr_err(
                "dilation",
                format!(
                    "stride {} together with dilation {} on axis {}: expected stride 1 or dilation 1 on each axis",
                    stride[a], dilation[a], AXIS[a]
                ),
            ));
        }
        if sub_m && transpose {
            return Err(attr_err("transpose", "expected 0 when subm = 1 (a submanifold convolution has no transposed form), got 1"));
        }
        if let Some(a) = (0..DIM_NB).find(|&a| transpose && dilation[a] > 1) {
            return Err(attr_err(
                "dilation",
                format!(
                    "expected 1 when transpose = 1 (the references disagree on the output size), got {} on axis {}",
                    dilation[a], AXIS[a]
                ),
            ));
        }
        if sub_m {
            each_axis("stride", &stride, "1 when subm = 1", |v| v == 1)?;
            for a in 0..DIM_NB {
                // Output size = input size with stride 1 <=> 2p = d(k-1).
                let span = i128::from(dilation[a]) * i128::from(filter_space[a] - 1);
                if span % 2 != 0 {
                    return Err(attr_err(
                        "kernel_size",
                        format!(
                            "subm keeps the output size equal to the input size, which needs dilation * (kernel - 1) even; axis {} has kernel {}, dilation {}",
                            AXIS[a], filter_space[a], dilation[a]
                        ),
                    ));
                }
                if i128::from(pad[a]) != span / 2 {
                    return Err(attr_err(
                        "padding",
                        format!(
                            "subm needs padding = dilation * (kernel - 1) / 2 = {} on axis {} (kernel {}, dilation {}) so the output size equals the input size, got {}",
                            span / 2,
                            AXIS[a],
                            filter_space[a],
                            dilation[a],
                            pad[a]
                        ),
                    ));
                }
            }
        }
        let mut op = GetIndicePairs {
            batch,
            pad,
            stride,
            dilation,
            input_space,
            filter_space,
            output_space: [0; DIM_NB],
            output_padding,
            sub_m,
            transpose,
            inverse: false,
        };
        for a in 0..DIM_NB {
            op.output_space[a] = op.output_size(a)?;
        }
        Ok(op)
    }

    fn plan(&self, inputs: &Inputs<'_>, par: &dyn Parallel) -> Result<(Vec<OutputSpec>, Plan)> {
        let (l, k, max) = self.validate(inputs)?;
        let v = inputs.get::<i32>(INDICES)?;
        let (num_out, book) = if l == 0 {
            (0, None)
        } else if self.sub_m {
            let wide = Layout::new(max).bits > u64::BITS;
            let book = if wide {
                Book::Subm128(self.subm_book(inputs, v.data, max)?)
            } else {
                Book::Subm64(self.subm_book(inputs, v.data, max)?)
            };
            (l, Some(book))
        } else {
            let o = self.output_space.map(|o| (o - 1) as u32);
            let wide = Layout::new([max[0], o[0], o[1], o[2]]).bits > u64::BITS;
            let (n, book) = if wide {
                let b = self.conv_book::<u128>(v.data, max[0], par)?;
                (b.sites.len(), Book::Conv128(b))
            } else {
                let b = self.conv_book::<u64>(v.data, max[0], par)?;
                (b.sites.len(), Book::Conv64(b))
            };
            (n, Some(book))
        };
        let specs = vec![
            OutputSpec::new(DType::I32, [k, 2, l]),
            OutputSpec::new(DType::I32, [num_out, 4]),
            OutputSpec::new(DType::I32, [k]),
        ];
        Ok((specs, Plan { l, k, num_out, book }))
    }

    fn execute(&self, plan: Plan, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
        let Plan { l, k, num_out, book } = plan;
        let indices = inputs.get_shaped::<i32>(INDICES, &[Some(l), Some(4)], "[L, 4] as planned")?;
        let pairs = outputs.take::<i32>(0)?;
        let out = outputs.take::<i32>(1)?;
        let num = outputs.take::<i32>(2)?;
        if pairs.len() != k * 2 * l || out.len() != num_out * 4 || num.len() != k {
            return Err(Error::Runtime(format!(
                "GetIndicePairs: host allocated {}, {}, {} output elements, expected {}, {}, {}",
                pairs.len(),
                out.len(),
                num.len(),
                k * 2 * l,
                num_out * 4,
                k
            )));
        }
        match book {
            None => num.fill(0),
            Some(Book::Conv64(b)) => write_conv(&b, pairs, out, num, l, par)?,
            Some(Book::Conv128(b)) => write_conv(&b, pairs, out, num, l, par)?,
            Some(Book::Subm64(b)) => {
                write_subm(&b, pairs, num, l, par);
                copy_rows(indices.data, out, par);
            }
            Some(Book::Subm128(b)) => {
                write_subm(&b, pairs, num, l, par);
                copy_rows(indices.data, out, par);
            }
        }
        Ok(())
    }
}

/// subm: out_indices equals indices row for row.
fn copy_rows(src: &[i32], dst: &mut [i32], par: &dyn Parallel) {
    let chunk = 4 * GRAIN;
    for_each_chunk_mut(par, dst, chunk, |t, d| {
        if let Some(s) = src.get(t * chunk..t * chunk + d.len()) {
            d.copy_from_slice(s);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::keys::{Key, SortedSites, radix_sort};
    use super::rulebook::*;
    use super::*;
    use crate::ops::descriptor;
    use crate::schema::AttrValue;
    use std::collections::HashMap;

    fn base() -> HashMap<String, AttrValue> {
        let mut m = HashMap::new();
        m.insert("batch_size".into(), AttrValue::Int(2));
        m.insert("spatial_shape".into(), AttrValue::Ints(vec![5, 6, 7]));
        m.insert("kernel_size".into(), AttrValue::Ints(vec![3, 3, 3]));
        m
    }

    fn with(pairs: &[(&str, AttrValue)]) -> HashMap<String, AttrValue> {
        let mut m = base();
        for (k, v) in pairs {
            m.insert((*k).into(), v.clone());
        }
        m
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// The attribute an error names, and its rule text.
    fn fails(m: &HashMap<String, AttrValue>) -> (String, String) {
        match descriptor::<GetIndicePairs>(m) {
            Err(Error::Attribute { name, rule }) => (name, rule),
            other => panic!("expected an attribute error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_build_the_seed_descriptor() {
        let op = descriptor::<GetIndicePairs>(&base()).expect("valid");
        assert_eq!(op.stride, [1, 1, 1]);
        assert_eq!(op.pad, [0, 0, 0]);
        assert_eq!(op.dilation, [1, 1, 1]);
        assert_eq!(op.output_padding, [0, 0, 0]);
        assert_eq!(op.output_space, [3, 4, 5]);
        assert!(!op.sub_m && !op.transpose && !op.inverse);
        assert_eq!(op.kernel_volume(), 27);
    }

    #[test]
    fn seed_configurations() {
        let subm = with(&[
            ("batch_size", AttrValue::Int(4)),
            ("spatial_shape", ints(&[41, 1440, 1440])),
            ("padding", ints(&[1, 1, 1])),
            ("subm", AttrValue::Int(1)),
        ]);
        let op = descriptor::<GetIndicePairs>(&subm).expect("valid");
        assert_eq!(op.output_space, [41, 1440, 1440]);
        let sparse = with(&[
            ("batch_size", AttrValue::Int(4)),
            ("spatial_shape", ints(&[11, 360, 360])),
            ("stride", ints(&[2, 2, 2])),
            ("padding", ints(&[0, 1, 1])),
        ]);
        let op = descriptor::<GetIndicePairs>(&sparse).expect("valid");
        assert_eq!(op.output_space, [5, 180, 180]);
    }

    #[test]
    fn transpose_output_size() {
        let m = with(&[("transpose", AttrValue::Int(1)), ("stride", ints(&[2, 2, 2])), ("output_padding", ints(&[1, 0, 0]))]);
        let op = descriptor::<GetIndicePairs>(&m).expect("valid");
        // (in - 1) * 2 + 2 + op + 1
        assert_eq!(op.output_space, [12, 13, 15]);
    }

    #[test]
    fn non_positive_values() {
        assert_eq!(fails(&with(&[("batch_size", AttrValue::Int(0))])).0, "batch_size");
        assert_eq!(fails(&with(&[("spatial_shape", ints(&[5, -1, 7]))])).0, "spatial_shape");
        assert_eq!(fails(&with(&[("kernel_size", ints(&[0, 1, 1]))])).0, "kernel_size");
        assert_eq!(fails(&with(&[("stride", ints(&[1, 1, 0]))])).0, "stride");
        assert_eq!(fails(&with(&[("dilation", ints(&[1, 0, 1]))])).0, "dilation");
        assert_eq!(fails(&with(&[("padding", ints(&[-1, 0, 0]))])).0, "padding");
        let (name, rule) = fails(&with(&[("output_padding", ints(&[0, 0, -2]))]));
        assert_eq!(name, "output_padding");
        assert!(rule.contains("-2") && rule.contains(">= 0"), "{rule}");
    }

    #[test]
    fn wrong_lengths_and_flags() {
        assert_eq!(fails(&with(&[("spatial_shape", ints(&[5, 6]))])).0, "spatial_shape");
        assert_eq!(fails(&with(&[("padding", ints(&[1, 1, 1, 1]))])).0, "padding");
        assert_eq!(fails(&with(&[("subm", AttrValue::Int(2))])).0, "subm");
        assert_eq!(fails(&with(&[("transpose", AttrValue::Int(-1))])).0, "transpose");
        assert_eq!(fails(&with(&[("inverse", AttrValue::Int(1))])).0, "inverse");
        let mut m = base();
        m.remove("batch_size");
        assert_eq!(fails(&m).0, "batch_size");
    }

    #[test]
    fn kernel_volume_limit() {
        let ok = with(&[("spatial_shape", ints(&[16, 16, 16])), ("kernel_size", ints(&[16, 16, 16]))]);
        assert!(descriptor::<GetIndicePairs>(&ok).is_ok());
        let (name, rule) = fails(&with(&[("spatial_shape", ints(&[1, 17, 241])), ("kernel_size", ints(&[1, 17, 241]))]));
        assert_eq!(name, "kernel_size");
        assert!(rule.contains("4097"), "{rule}");
        // Product overflowing i64.
        let (name, _) = fails(&with(&[("kernel_size", ints(&[i64::MAX, i64::MAX, 2]))]));
        assert_eq!(name, "kernel_size");
    }

    #[test]
    fn stride_with_dilation_on_one_axis() {
        let (name, rule) = fails(&with(&[("stride", ints(&[1, 2, 1])), ("dilation", ints(&[1, 2, 1]))]));
        assert_eq!(name, "dilation");
        assert!(rule.contains("stride 2 together with dilation 2 on axis 1"), "{rule}");
        let ok = with(&[("spatial_shape", ints(&[4, 5, 3])), ("kernel_size", ints(&[1, 3, 1])), ("stride", ints(&[2, 1, 1])), ("dilation", ints(&[1, 2, 1]))]);
        assert_eq!(descriptor::<GetIndicePairs>(&ok).expect("valid").output_space, [2, 1, 3]);
    }

    #[test]
    fn output_size_rules() {
        let (name, rule) = fails(&with(&[("spatial_shape", ints(&[3, 2, 3]))]));
        assert_eq!(name, "kernel_size");
        assert!(rule.contains("axis 1") && rule.contains("= 0"), "{rule}");
        // Floor, not truncation: (2 - 2 - 1) / 2 + 1 would be 1 with truncation.
        let (name, _) = fails(&with(&[("spatial_shape", ints(&[5, 2, 7])), ("stride", ints(&[2, 2, 2]))]));
        assert_eq!(name, "kernel_size");
        let m = with(&[("spatial_shape", ints(&[1, 1, 1])), ("kernel_size", ints(&[1, 1, 1])), ("padding", ints(&[1, 0, 0])), ("transpose", AttrValue::Int(1))]);
        assert_eq!(fails(&m).0, "padding");
        // Huge attributes: no overflow, a clear error or a valid size.
        let m = with(&[("spatial_shape", ints(&[i64::MAX, 5, 5])), ("padding", ints(&[i64::MAX, 0, 0]))]);
        let (name, rule) = fails(&m);
        assert_eq!(name, "spatial_shape");
        assert!(rule.contains("2147483647"), "{rule}");
        let m = with(&[("spatial_shape", ints(&[i64::MAX, 5, 5])), ("padding", ints(&[i64::MAX, 0, 0])), ("stride", ints(&[i64::MAX, 1, 1]))]);
        assert_eq!(descriptor::<GetIndicePairs>(&m).expect("valid").output_space, [3, 3, 3]);
        let m = with(&[("transpose", AttrValue::Int(1)), ("stride", ints(&[i64::MAX, 1, 1])), ("spatial_shape", ints(&[i64::MAX, 5, 5]))]);
        assert_eq!(fails(&m).0, "spatial_shape");
        let m = with(&[("spatial_shape", ints(&[1 << 31, 5, 5])), ("kernel_size", ints(&[1, 1, 1]))]);
        assert_eq!(fails(&m).0, "spatial_shape");
        let m = with(&[("spatial_shape", ints(&[(1 << 31) - 1, 5, 5])), ("kernel_size", ints(&[1, 1, 1]))]);
        assert_eq!(descriptor::<GetIndicePairs>(&m).expect("valid").output_space[0], i64::from(i32::MAX));
    }

    #[test]
    fn subm_rules() {
        let subm = |extra: &[(&str, AttrValue)]| {
            let mut m = with(&[("subm", AttrValue::Int(1)), ("padding", ints(&[1, 1, 1]))]);
            for (k, v) in extra {
                m.insert((*k).into(), v.clone());
            }
            m
        };
        assert!(descriptor::<GetIndicePairs>(&subm(&[])).is_ok());
        assert_eq!(fails(&subm(&[("stride", ints(&[2, 1, 1]))])).0, "stride");
        let (name, rule) = fails(&subm(&[("padding", ints(&[1, 0, 1]))]));
        assert_eq!(name, "padding");
        assert!(rule.contains("axis 1") && rule.contains("= 1"), "{rule}");
        assert_eq!(fails(&subm(&[("dilation", ints(&[2, 2, 2]))])).0, "padding");
        assert!(descriptor::<GetIndicePairs>(&subm(&[("dilation", ints(&[2, 2, 2])), ("padding", ints(&[2, 2, 2]))])).is_ok());
        assert_eq!(fails(&subm(&[("kernel_size", ints(&[2, 2, 2])), ("padding", ints(&[0, 0, 0]))])).0, "kernel_size");
        assert_eq!(fails(&subm(&[("transpose", AttrValue::Int(1))])).0, "transpose");
        // output_padding is checked but unused outside transpose.
        assert!(descriptor::<GetIndicePairs>(&subm(&[("output_padding", ints(&[3, 3, 3]))])).is_ok());
    }

    #[test]
    fn transpose_rejects_dilation() {
        let (name, rule) = fails(&with(&[("transpose", AttrValue::Int(1)), ("dilation", ints(&[1, 1, 2]))]));
        assert_eq!(name, "dilation");
        assert!(rule.contains("transpose"), "{rule}");
    }

    #[test]
    fn keys_keep_lexicographic_order() {
        let l = Layout::new([3, 40, 1439, 1439]);
        assert_eq!(l.bits, 2 + 6 + 11 + 11);
        let a = u64::pack(&l, [1, 0, 1439, 1439]);
        let b = u64::pack(&l, [1, 1, 0, 0]);
        assert!(a < b);
        assert_eq!(b.unpack(&l), [1, 1, 0, 0]);
        let zero = Layout::new([0, 0, 0, 0]);
        assert_eq!(zero.bits, 0);
        assert_eq!(u64::pack(&zero, [0, 0, 0, 0]), 0);
        let wide = Layout::new([i32::MAX as u32; 4]);
        assert_eq!(wide.bits, 124);
        let c = [i32::MAX as u32, 5, i32::MAX as u32, 0];
        assert_eq!(u128::pack(&wide, c).unpack(&wide), c);
    }

    #[test]
    fn radix_sort_is_a_stable_sort() {
        let mut state = 0x1234_5678_u64;
        let mut v: Vec<(u64, u32)> = (0..5000)
            .map(|i| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) & 0xFFFF, i)
            })
            .collect();
        let mut want = v.clone();
        want.sort_by_key(|x| x.0);
        radix_sort(&mut v, 16, |x| x.0).unwrap();
        assert_eq!(v, want);
    }

    /// Lookups in sorted sites find every present key at its position and no absent key,
    /// with prefix tables of 16 bits (few keys), of log2(keys) bits (many keys, clustered
    /// or spread) and of the key's full width.
    #[test]
    fn sorted_sites_find_exactly_the_present_keys() {
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        for (n, bits, spread) in [(1000, 40, 40), (300_000, 40, 40), (300_000, 40, 22), (300_000, 18, 18), (0, 30, 30)] {
            let mask = (1u64 << spread) - 1;
            let mut keys: Vec<u64> = (0..n).map(|_| next() & mask & !1).collect();
            keys.sort_unstable();
            keys.dedup();
            let sites = SortedSites::new(keys.clone(), bits).unwrap();
            // One table entry per key at most (beyond the 16-bit minimum): the memory bound.
            assert!(sites.starts.len() - 1 <= keys.len().max(1 << 16), "{} entries for {} keys", sites.starts.len(), keys.len());
            for (p, &k) in keys.iter().enumerate() {
                assert_eq!(sites.find(k), Some(p), "key {k:#x} of {n}, {bits} bits");
                // Present keys are even, so k + 1 is absent.
                assert_eq!(sites.find(k + 1), None, "absent key {:#x} of {n}, {bits} bits", k + 1);
            }
        }
    }

    /// What a conv book writes: indice_pairs, out_indices, indice_num.
    fn written<K: Key>(op: &GetIndicePairs, book: &ConvBook<K>, l: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
        let k = op.kernel_volume();
        let (mut pairs, mut out, mut num) = (vec![0i32; k * 2 * l], vec![0i32; book.sites.len() * 4], vec![0i32; k]);
        write_conv(book, &mut pairs, &mut out, &mut num, l, &crate::parallel::Serial).unwrap();
        (pairs, out, num)
    }

    /// Conv and transposed conv rulebooks (unique sites, and every offset's pairs) come out
    /// the same whatever the emission block and sort range sizes and the thread count, and
    /// with the output sites sorted or marked in a bitmap of the grid.
    #[test]
    fn conv_book_is_the_same_for_any_block_and_range_size_sorted_or_dense() {
        use crate::parallel::{Serial, Threads};
        let conv = with(&[("stride", ints(&[2, 1, 2])), ("padding", ints(&[1, 0, 1]))]);
        let transpose = with(&[("transpose", AttrValue::Int(1)), ("stride", ints(&[2, 2, 1]))]);
        let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
        let mut below = move |n: u64| (next() % n) as i32;
        // Random rows, duplicates included (legal outside subm).
        let data: Vec<i32> = (0..700).flat_map(|_| [below(2), below(5), below(6), below(7)]).collect();
        let l = data.len() / 4;
        for attrs in [conv, transpose] {
            let op = descriptor::<GetIndicePairs>(&attrs).unwrap();
            let whole = op.conv_book_in::<u64>(&data, 1, &Serial, usize::MAX, usize::MAX, 0).unwrap();
            assert_eq!(whole.blocks.len(), 1);
            let Sites::Sorted(sorted) = &whole.sites else { panic!("no bitmap allowed, yet one was made") };
            assert!(sorted.keys.windows(2).all(|w| w[0] < w[1]));
            let want = written(&op, &whole, l);
            assert!(want.1.chunks_exact(4).all(|c| c[0] < 2), "batches 0 and 1 only");
            for (emit_rows, sort_keys) in [(1, 1), (7, 3), (64, 50), (699, 1000)] {
                for threads in 1..=3 {
                    for dense_words in [0, usize::MAX] {
                        let book = op.conv_book_in::<u64>(&data, 1, &Threads(threads), emit_rows, sort_keys, dense_words).unwrap();
                        assert_eq!(matches!(book.sites, Sites::Dense(_)), dense_words > 0);
                        let what = format!("blocks of {emit_rows}, ranges of {sort_keys}, {threads} threads, dense {dense_words}");
                        assert_eq!(written(&op, &book, l), want, "{what}");
                        if let Sites::Dense(grid) = &book.sites {
                            // The sites written in parts of one site or more, in parallel.
                            for grain in [1, 5] {
                                let mut out = vec![0i32; want.1.len()];
                                grid.write(&mut out, grain, &Threads(threads)).unwrap();
                                assert_eq!(out, want.1, "{what}, parts of {grain}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Through the operator's own entry point, the bitmap is used where the grid is small
    /// against the pairs the rows can emit, and not where it is large: a strided 3x3x3
    /// conv of 2,000 rows into 20 x 63 x 63 outputs marks a bitmap; the same rows into 20
    /// x 719 x 719 (1.29 MB of bitmap for at most 16,000 pairs) sort their keys, as do rows
    /// into a big kernel with a big stride (at most one output per row).
    #[test]
    fn conv_book_takes_the_bitmap_only_for_a_grid_small_against_the_pairs() {
        let rows = |n: i32, span: i32| (0..n).flat_map(move |i| [0, i % 41, (i * 7) % span, (i * 13) % span]).collect::<Vec<i32>>();
        let book = |spatial: [i64; 3], kernel: [i64; 3], stride: [i64; 3], data: &[i32]| {
            let attrs = with(&[("spatial_shape", ints(&spatial)), ("kernel_size", ints(&kernel)), ("stride", ints(&stride)), ("padding", ints(&[0, 0, 0]))]);
            let op = descriptor::<GetIndicePairs>(&attrs).unwrap();
            matches!(op.conv_book::<u64>(data, 0, &crate::parallel::Serial).unwrap().sites, Sites::Dense(_))
        };
        assert!(book([41, 128, 128], [3, 3, 3], [2, 2, 2], &rows(2000, 128)));
        assert!(!book([41, 1440, 1440], [3, 3, 3], [2, 2, 2], &rows(2000, 1440)));
        // 16 x 16 x 16 taps, stride 16: a row reaches one output, so 2,000 rows allow 4,096
        // words (the floor), and the 3 x 4096 x 4096 outputs need 786,432 (a bound of a
        // quarter word per tap, 2,048,000, would have taken it).
        assert!(!book([48, 65536, 65536], [16, 16, 16], [16, 16, 16], &rows(2000, 65536)));
    }

    /// A grid just over the bitmap bound is sorted, one at it is marked.
    #[test]
    fn the_output_grid_is_a_bitmap_only_within_its_bound() {
        let op = descriptor::<GetIndicePairs>(&with(&[("stride", ints(&[2, 2, 2]))])).unwrap();
        let data = [0, 1, 2, 3, 1, 4, 5, 6];
        let o = op.output_space.map(|v| v as usize);
        let words = (2 * o[0] * o[1] * o[2]).div_ceil(64);
        let book = |max_words| op.conv_book_in::<u64>(&data, 1, &crate::parallel::Serial, 1, 1, max_words).unwrap();
        assert!(matches!(book(words).sites, Sites::Dense(_)));
        assert!(matches!(book(words - 1).sites, Sites::Sorted(_)));
        assert_eq!(written(&op, &book(words), 2), written(&op, &book(words - 1), 2));
    }

    /// Wide (u128) keys: the same rulebook with and without cuts.
    #[test]
    fn wide_key_conv_book_is_the_same_for_any_cut() {
        use crate::parallel::{Serial, Threads};
        let big = 1i64 << 22;
        let op = descriptor::<GetIndicePairs>(&with(&[("spatial_shape", ints(&[big, big, big]))])).unwrap();
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut below = move |n: i64| (next() % n as u64) as i32;
        // Clusters, so that neighbouring sites share output sites.
        let data: Vec<i32> = (0..300)
            .flat_map(|i| {
                let c = [below(2), below(big - 8), below(big - 8), below(big - 8)];
                [c[0], c[1] + i % 3, c[2] + below(3), c[3] + below(3)]
            })
            .collect();
        let layout = Layout::new([1, big as u32 - 3, big as u32 - 3, big as u32 - 3]);
        assert!(layout.bits > u64::BITS);
        // (A grid of 2^67 sites is never a bitmap.)
        let whole = op.conv_book_in::<u128>(&data, 1, &Serial, usize::MAX, usize::MAX, usize::MAX).unwrap();
        for (emit_rows, sort_keys) in [(1, 1), (13, 40)] {
            let book = op.conv_book_in::<u128>(&data, 1, &Threads(2), emit_rows, sort_keys, usize::MAX).unwrap();
            let (Sites::Sorted(a), Sites::Sorted(b)) = (&book.sites, &whole.sites) else { panic!("a bitmap of 2^67 sites") };
            assert_eq!(a.keys, b.keys);
            for k in 0..op.kernel_volume() {
                let rows = |b: &ConvBook<u128>| b.blocks.iter().flat_map(|e| e.rows[k].clone()).collect::<Vec<_>>();
                let keys = |b: &ConvBook<u128>| b.blocks.iter().flat_map(|e| e.keys[k].clone()).collect::<Vec<_>>();
                assert_eq!(rows(&book), rows(&whole));
                assert_eq!(keys(&book), keys(&whole));
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Random conv and transposed-conv geometries: cutting the rulebook into blocks and
        /// sort ranges (on 2 threads), or marking the sites in a bitmap, never changes it.
        #[test]
        fn prop_conv_book_does_not_depend_on_the_cut(
            spatial in proptest::array::uniform3(1i64..9),
            kernel in proptest::array::uniform3(1i64..5),
            stride in proptest::array::uniform3(1i64..4),
            padding in proptest::array::uniform3(0i64..3),
            dilate in proptest::array::uniform3(1i64..3),
            transpose in proptest::bool::ANY,
            rows in proptest::collection::vec(proptest::array::uniform4(0u32..1000), 0..150),
            emit_rows in 1usize..20,
            sort_keys in 1usize..60,
            dense in proptest::bool::ANY,
        ) {
            use crate::parallel::{Serial, Threads};
            // Dilation only where the stride is 1, and never with transpose (contract rules).
            let dilation: Vec<i64> = (0..3).map(|a| if stride[a] > 1 || transpose { 1 } else { dilate[a] }).collect();
            let attrs = with(&[
                ("spatial_shape", ints(&spatial)),
                ("kernel_size", ints(&kernel)),
                ("stride", ints(&stride)),
                ("padding", ints(&padding)),
                ("dilation", ints(&dilation)),
                ("transpose", AttrValue::Int(i64::from(transpose))),
            ]);
            // Geometries without a valid output size are attribute errors, tested elsewhere.
            let Ok(op) = descriptor::<GetIndicePairs>(&attrs) else { return Ok(()) };
            let data: Vec<i32> = rows
                .iter()
                .flat_map(|r| [r[0] % 2, r[1] % spatial[0] as u32, r[2] % spatial[1] as u32, r[3] % spatial[2] as u32])
                .map(|v| v as i32)
                .collect();
            if data.is_empty() {
                return Ok(());
            }
            let max_batch = data.chunks_exact(4).map(|r| r[0] as u32).max().unwrap_or(0);
            let whole = op.conv_book_in::<u64>(&data, max_batch, &Serial, usize::MAX, usize::MAX, 0).unwrap();
            let book = op.conv_book_in::<u64>(&data, max_batch, &Threads(2), emit_rows, sort_keys, if dense { usize::MAX } else { 0 }).unwrap();
            proptest::prop_assert_eq!(written(&op, &book, data.len() / 4), written(&op, &whole, data.len() / 4));
        }
    }
}

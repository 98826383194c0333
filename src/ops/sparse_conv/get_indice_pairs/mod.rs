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

use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, Check, RowValues, ValueRule, check_values};
use crate::parallel::{Parallel, balanced_cuts, for_each_chunk_mut, pieces};
use crate::schema::Attrs;
use crate::scratch::{self, FirstError};
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub mod bang;
mod keys;
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
        Some(a) => Err(attr_err(
            name,
            format!("expected every value {what}, got {} on axis {} in {v:?}", v[a], AXIS[a]),
        )),
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
            let f =
                format!("transpose ({i} - 1) * {s} - 2 * {p} + {d} * ({k} - 1) + {op} + 1 = {out}");
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

/// What `find` finds beyond the sizes: the output site count and the rulebook (`None`
/// when L = 0).
pub struct FoundRulebook {
    num_out: usize,
    book: Option<Book>,
}

/// Row `r` of the [L, 4] indices as (batch, z, y, x).
fn rows4(data: &[i32]) -> impl Iterator<Item = [i32; 4]> + '_ {
    data.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]])
}

/// The largest value of each column of indices that passed the value rule (every value in
/// [0, limit) of its column).
fn column_maxima(indices: &[i32]) -> [u32; 4] {
    let mut max = [0u32; 4];
    for row in rows4(indices) {
        for f in 0..4 {
            max[f] = max[f].max(row[f] as u32);
        }
    }
    max
}

impl GetIndicePairs {
    /// The shape and value rules (the CPU path), and the largest value of each column.
    pub(super) fn validate(&self, inputs: &Inputs<'_>) -> Result<(usize, usize, [u32; 4])> {
        let d = self.shape_rules(inputs)?;
        check_values(self, inputs, &d)?;
        Ok((d.l, d.k, column_maxima(inputs.get::<i32>(INDICES)?.data)))
    }
}

impl GetIndicePairs {
    /// out_indices [num_out, 4] for `num_out` output sites.
    pub(super) fn out_indices_spec(num_out: usize) -> OutputSpec {
        OutputSpec::new(DType::I32, [num_out, 4])
    }
}

/// The sizes GetIndicePairs' shape rules find: L input rows, K kernel offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GipDims {
    pub l: usize,
    pub k: usize,
}

impl Operator for GetIndicePairs {
    const NAME: &'static str = "GetIndicePairs";
    const SCHEMA: &'static str =
        include_str!("../../../../schemas/sparse_conv/get_indice_pairs.json");
    type Dims = GipDims;
    type Found = FoundRulebook;

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
                format!(
                    "expected K = kd * kh * kw <= {MAX_KERNEL_VOLUME}, got {filter_space:?}: K = {shown}"
                ),
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
                format!(
                    "expected 0 (an inverse convolution reuses the forward pairs), got {inverse}"
                ),
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
            return Err(attr_err(
                "transpose",
                "expected 0 when subm = 1 (a submanifold convolution has no transposed form), got 1",
            ));
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

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<GipDims> {
        let l = inputs.shaped::<i32>(INDICES, &[None, Some(4)], "[L, 4]")?[0];
        let k = self.kernel_volume();
        // Every element offset of indice_pairs (and so every row index, L * K and the
        // output count) must fit int32.
        let pairs_len = k.checked_mul(2).and_then(|n| n.checked_mul(l));
        if pairs_len.is_none_or(|n| n > i32::MAX as usize) {
            return Err(Error::output(
                "indice_pairs",
                format!(
                    "K * 2 * L = {k} * 2 * {l} elements exceed the int32 index range (max {})",
                    i32::MAX
                ),
            ));
        }
        Ok(GipDims { l, k })
    }

    /// indice_pairs [K, 2, L], out_indices and indice_num [K]. The declared exception:
    /// out_indices has a row per unique output site, a count only the indices' values give
    /// (found by `plan` on the host, on the card by the kernels or the library). It is
    /// declared here with none, its shape when L = 0; every path allocates it as
    /// [`GetIndicePairs::out_indices_spec`] once it has counted the sites.
    fn output_specs(&self, d: &GipDims) -> Vec<OutputSpec> {
        vec![
            OutputSpec::new(DType::I32, [d.k, 2, d.l]),
            Self::out_indices_spec(0),
            OutputSpec::new(DType::I32, [d.k]),
        ]
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
            return inputs.error(
                INDICES,
                format!("row {r} = {:?} breaks the coordinate rule", broken.values),
            );
        };
        let limits = [self.batch, self.input_space[0], self.input_space[1], self.input_space[2]];
        let f = (0..4)
            .find(|&f| row.get(f).is_some_and(|&v| v < 0 || i64::from(v) >= limits[f]))
            .unwrap_or(0);
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

    fn find(&self, inputs: &Inputs<'_>, d: &GipDims, par: &dyn Parallel) -> Result<FoundRulebook> {
        let v = inputs.get::<i32>(INDICES)?;
        let max = column_maxima(v.data);
        let (num_out, book) = if d.l == 0 {
            (0, None)
        } else if self.sub_m {
            let wide = Layout::new(max).bits > u64::BITS;
            let book = if wide {
                Book::Subm128(self.subm_book(inputs, v.data, max)?)
            } else {
                Book::Subm64(self.subm_book(inputs, v.data, max)?)
            };
            (d.l, Some(book))
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
        Ok(FoundRulebook { num_out, book })
    }

    /// out_indices with a row per output site found.
    fn found_specs(&self, d: &GipDims, found: &FoundRulebook) -> Vec<OutputSpec> {
        let mut specs = self.output_specs(d);
        specs[1] = Self::out_indices_spec(found.num_out);
        specs
    }

    fn execute(
        &self,
        d: GipDims,
        found: FoundRulebook,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let (GipDims { l, k }, FoundRulebook { num_out, book }) = (d, found);
        let indices =
            inputs.get_shaped::<i32>(INDICES, &[Some(l), Some(4)], "[L, 4] as planned")?;
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
mod tests;

//! IndiceConv (spconv v1 / mmcv indice_conv; schemas/indice_conv.json): the sparse 3D
//! convolution over a GetIndicePairs rulebook, `output[dst] += features[src] @ filters[k]`
//! for every valid pair of every kernel offset k, after `bias`.
//!
//! Determinism without atomics: `plan` validates the rulebook and counting-sorts its pairs by
//! destination row (stable, so each row keeps the contract's (k, j) order). Tasks own blocks
//! of output rows; a block walks the kernel offsets in ascending order and, for each, applies
//! the block rows' pairs of that offset, so `filters[k]` stays in cache while it serves the
//! whole block. Every output element therefore sums bias, then its pairs in (k, j) order,
//! each product `x * w` and each sum rounded separately, whatever the thread count.
//! No MLU kernel: the EP declines it.

use super::Operator;
use crate::error::{Error, Result};
use crate::parallel::{Parallel, for_each_part_mut};
use crate::schema::Attrs;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

const FEATURES: usize = 0;
const FILTERS: usize = 1;
const PAIRS: usize = 2;
const NUM: usize = 3;
const OUT_INDICES: usize = 4;
const BIAS: usize = 5;
/// Output rows per block: a block's rows stay in cache while the offsets are walked.
const BLOCK_ROWS: usize = 64;
/// Multiply-adds per task, roughly.
const GRAIN: usize = 256 * 1024;

/// The configured node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndiceConv {
    /// Gather from slot 1 and scatter to slot 0 of each pair.
    pub inverse: bool,
}

/// The validated rulebook, grouped by destination row.
#[derive(Debug)]
pub struct Rules {
    l: usize,
    cin: usize,
    cout: usize,
    rows: usize,
    /// `pairs[starts[o]..starts[o + 1]]` are output row o's (k, src), ascending in (k, j).
    starts: Vec<usize>,
    pairs: Vec<(u32, u32)>,
}

impl Operator for IndiceConv {
    const NAME: &'static str = "IndiceConv";
    type Plan = Rules;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        match attrs.int("inverse")? {
            0 => Ok(IndiceConv { inverse: false }),
            1 => Ok(IndiceConv { inverse: true }),
            v => Err(Error::attribute("inverse", format!("must be 0 or 1, got {v}"))),
        }
    }

    fn plan(&self, inputs: &Inputs<'_>, _par: &dyn Parallel) -> Result<(Vec<OutputSpec>, Rules)> {
        let features = inputs.get_shaped::<f32>(FEATURES, &[None, None], "[L, Cin]")?;
        let (l, cin) = (features.shape[0], features.shape[1]);
        let filters =
            inputs.get_shaped::<f32>(FILTERS, &[None, Some(cin), None], &format!("[K, Cin, Cout] (Cin = {cin} of features)"))?;
        let (k_count, cout) = (filters.shape[0], filters.shape[2]);
        let pairs = inputs.get_shaped::<i32>(PAIRS, &[Some(k_count), Some(2), None], &format!("[K, 2, P] (K = {k_count} of filters)"))?;
        let p = pairs.shape[2];
        let num = inputs.get_shaped::<i32>(NUM, &[Some(k_count)], &format!("[K] (K = {k_count} of filters)"))?;
        let out_indices = inputs.get::<i32>(OUT_INDICES)?;
        if out_indices.shape.len() != 2 {
            return Err(inputs.error(OUT_INDICES, format!("expected shape [num_out, D], got {:?}", out_indices.shape)));
        }
        let rows = out_indices.shape[0];
        if let Some(bias) = inputs.get_optional::<f32>(BIAS)?
            && bias.shape != [cout]
        {
            return Err(inputs.error(BIAS, format!("expected shape [Cout] = [{cout}], got {:?}", bias.shape)));
        }
        let numel = rows.checked_mul(cout).filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if numel.is_none() {
            return Err(Error::output("output", format!("[num_out, Cout] = [{rows}, {cout}] is too large")));
        }
        // Which slot is read (source) and which is written (destination).
        let (src_slot, dst_slot) = if self.inverse { (1, 0) } else { (0, 1) };
        let slot_name = |s: usize| if s == 0 { "input row (slot 0)" } else { "output row (slot 1)" };
        let mut counts = vec![0usize; rows + 1];
        let mut total = 0usize;
        for (k, &n) in num.data.iter().enumerate() {
            let n = usize::try_from(n).ok().filter(|&n| n <= p).ok_or_else(|| {
                inputs.error(NUM, format!("indice_num[{k}] = {n} is outside [0, P] with P = {p} (indice_pairs' last dimension)"))
            })?;
            let base = k * 2 * p;
            for (slot, limit, what) in [(src_slot, l, "L (features' rows)"), (dst_slot, rows, "num_out (out_indices' rows)")] {
                let vals = &pairs.data[base + slot * p..base + slot * p + n];
                if let Some(j) = vals.iter().position(|&x| x as u32 as usize >= limit) {
                    return Err(inputs.error(
                        PAIRS,
                        format!(
                            "indice_pairs[{k}, {slot}, {j}] = {} ({}) is outside [0, {limit}) with {limit} = {what}",
                            vals[j],
                            slot_name(slot)
                        ),
                    ));
                }
            }
            for &o in &pairs.data[base + dst_slot * p..base + dst_slot * p + n] {
                counts[o as usize + 1] += 1;
            }
            total += n;
        }
        if l > u32::MAX as usize || k_count > u32::MAX as usize {
            return Err(inputs.error(FEATURES, format!("L = {l} or K = {k_count} is too large")));
        }
        for o in 0..rows {
            counts[o + 1] += counts[o];
        }
        let starts = counts;
        let mut cursor = starts.clone();
        let mut grouped = vec![(0u32, 0u32); total];
        for (k, &n) in num.data.iter().enumerate() {
            let base = k * 2 * p;
            let n = n as usize;
            let src = &pairs.data[base + src_slot * p..base + src_slot * p + n];
            let dst = &pairs.data[base + dst_slot * p..base + dst_slot * p + n];
            for (&s, &o) in src.iter().zip(dst) {
                let c = &mut cursor[o as usize];
                grouped[*c] = (k as u32, s as u32);
                *c += 1;
            }
        }
        let specs = vec![OutputSpec::new(DType::F32, [rows, cout])];
        Ok((specs, Rules { l, cin, cout, rows, starts, pairs: grouped }))
    }

    fn execute(&self, r: Rules, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
        let features = inputs.get::<f32>(FEATURES)?.data;
        let filters = inputs.get::<f32>(FILTERS)?.data;
        let bias = inputs.get_optional::<f32>(BIAS)?.map(|b| b.data);
        let out = outputs.take::<f32>(0)?;
        let (cin, cout) = (r.cin, r.cout);
        if out.len() != r.rows * cout || features.len() != r.l * cin || filters.len() % (cin * cout).max(1) != 0 {
            return Err(Error::Runtime("IndiceConv: buffers do not match the plan".into()));
        }
        if out.is_empty() {
            return Ok(());
        }
        // Blocks of BLOCK_ROWS rows; tasks of whole blocks with about GRAIN multiply-adds.
        let mut bounds = vec![0usize];
        let mut work = 0usize;
        for block in (BLOCK_ROWS..r.rows).step_by(BLOCK_ROWS) {
            work += (r.starts[block] - r.starts[block - BLOCK_ROWS]) * cin * cout + BLOCK_ROWS * cout;
            if work >= GRAIN {
                bounds.push(block * cout);
                work = 0;
            }
        }
        bounds.push(out.len());
        for_each_part_mut(par, out, &bounds, |t, part| {
            let first = bounds[t] / cout;
            let mut cursor = Vec::with_capacity(BLOCK_ROWS);
            for (b, block) in part.chunks_mut(BLOCK_ROWS * cout).enumerate() {
                let row0 = first + b * BLOCK_ROWS;
                let n_rows = block.len() / cout;
                for row in block.chunks_exact_mut(cout) {
                    match bias {
                        Some(bias) => row.copy_from_slice(bias),
                        None => row.fill(0.0),
                    }
                }
                cursor.clear();
                cursor.extend((row0..row0 + n_rows).map(|o| r.starts[o]));
                // Offsets in ascending order, each applied to every row of the block.
                let mut k = r.pairs[r.starts[row0]..r.starts[row0 + n_rows]].iter().map(|p| p.0).min();
                while let Some(kk) = k {
                    let w = &filters[kk as usize * cin * cout..(kk as usize + 1) * cin * cout];
                    let mut next: Option<u32> = None;
                    for (i, row) in block.chunks_exact_mut(cout).enumerate() {
                        let end = r.starts[row0 + i + 1];
                        let c = &mut cursor[i];
                        while *c < end && r.pairs[*c].0 == kk {
                            let x = &features[r.pairs[*c].1 as usize * cin..(r.pairs[*c].1 as usize + 1) * cin];
                            for (&xi, wrow) in x.iter().zip(w.chunks_exact(cout)) {
                                for (o, &wv) in row.iter_mut().zip(wrow) {
                                    *o += xi * wv;
                                }
                            }
                            *c += 1;
                        }
                        if *c < end {
                            next = Some(next.map_or(r.pairs[*c].0, |n| n.min(r.pairs[*c].0)));
                        }
                    }
                    k = next;
                }
            }
        });
        Ok(())
    }
}

//! DynamicScatter (mmcv dynamic_point_to_voxel forward; schemas/dynamic_scatter/dynamic_scatter.json): groups
//! the points by voxel coordinate and reduces each voxel's feature rows (max, mean or sum).
//!
//! `plan` finds the voxels, since their number M is an output dimension: the kept points
//! (no negative coordinate) are sorted by (coordinate row, point index), so equal rows form
//! runs in ascending coordinate order and, inside a run, ascending point order. `execute`
//! then writes the index outputs and reduces each voxel's rows in point order, parallel over
//! blocks of voxels (each task owns its voxels' output rows), so the result is the same
//! bits whatever the thread count. The BANG path (`bang.rs`) gives the same bits on the card.

use super::Reduce;
use crate::cache;
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::radix::radix_sort;
use crate::parallel::{Parallel, for_each_part_mut};
use crate::schema::Attrs;
use crate::scratch::{self, FirstError};
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

const FEATS: usize = 0;
const COORS: usize = 1;
/// Feature elements reduced per task.
const GRAIN: usize = 32 * 1024;

/// The configured node: the reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicScatter {
    pub reduce: Reduce,
}

/// The voxels found by `plan`: what `execute` needs beyond the sizes.
#[derive(Debug)]
pub struct Voxels {
    /// Kept points sorted by (coordinate row, point index).
    order: Vec<u32>,
    /// `order[starts[v]..starts[v + 1]]` are voxel v's points; length M + 1.
    starts: Vec<usize>,
}

impl Voxels {
    pub(super) fn m(&self) -> usize {
        self.starts.len() - 1
    }
}

/// The sizes DynamicScatter's shape rules find: N points, C channels, D coordinate columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub n: usize,
    pub c: usize,
    pub d: usize,
}

impl Dims {
    /// The outputs for M voxels: voxel_feats [M, C], voxel_coors [M, D], point2voxel_map
    /// [N], voxel_points_count [M], voxel_num [1].
    pub fn specs(&self, m: usize) -> Vec<OutputSpec> {
        vec![
            OutputSpec::new(DType::F32, [m, self.c]),
            OutputSpec::new(DType::I32, [m, self.d]),
            OutputSpec::new(DType::I32, [self.n]),
            OutputSpec::new(DType::I32, [m]),
            OutputSpec::new(DType::I32, [1]),
        ]
    }
}

impl Operator for DynamicScatter {
    const NAME: &'static str = "DynamicScatter";
    const SCHEMA: &'static str =
        include_str!("../../../schemas/dynamic_scatter/dynamic_scatter.json");
    type Dims = Dims;
    type Found = Voxels;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        // Same attribute, same rule as the backward op.
        let reduce = Reduce::from_attributes(attrs)?;
        Ok(DynamicScatter { reduce })
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        let shape = inputs.shaped::<f32>(FEATS, &[None, None], "[N, C]")?;
        let (n, c) = (shape[0], shape[1]);
        let d =
            inputs.shaped::<i32>(COORS, &[Some(n), None], &format!("[N, D] (N = {n} of feats)"))?
                [1];
        if d == 0 {
            return Err(
                inputs.error(COORS, "must have at least one coordinate column (D >= 1), got D = 0")
            );
        }
        // Point and voxel indices are int32 outputs.
        crate::ops::operator::check_i32_range(
            || inputs.error(FEATS, format!("N = {n} points do not fit int32 indices")),
            n,
        )?;
        Ok(Dims { n, c, d })
    }

    /// The declared exception with GetIndicePairs' out_indices: M, the voxel count, is known
    /// only from the coordinates' values (found by `plan` on the host, on the card by the
    /// kernels), so the outputs are declared here with M = 0; every path allocates
    /// [`Dims::specs`] once it has counted the voxels.
    fn output_specs(&self, d: &Dims) -> Vec<OutputSpec> {
        d.specs(0)
    }

    fn find(&self, inputs: &Inputs<'_>, dims: &Dims, _: &dyn Parallel) -> Result<Voxels> {
        let Dims { n, d, .. } = *dims;
        let coors = inputs.get::<i32>(COORS)?.data;
        let row = |i: u32| &coors[i as usize * d..(i as usize + 1) * d];
        let mut order = scratch::collect(
            (0..n as u32).filter(|&i| row(i).iter().all(|&x| x >= 0)),
            "the valid points",
        )?;
        // Each column packed in just the bits of its largest value, the first column highest:
        // keys then compare as the rows do.
        // D is bounded by the input's length only when some point is kept.
        let mut widths = scratch::filled(
            if order.is_empty() { 0 } else { d },
            0u32,
            "the coordinate columns' widths",
        )?;
        for &i in &order {
            for (w, &x) in widths.iter_mut().zip(row(i)) {
                *w = (*w).max(u32::BITS - (x as u32).leading_zeros());
            }
        }
        if widths.iter().map(|&w| u64::from(w)).sum::<u64>() <= u64::from(u64::BITS) {
            let pack = |i: u32| {
                row(i)
                    .iter()
                    .zip(&widths)
                    .fold(0u64, |key, (&x, &w)| key.unbounded_shl(w) | x as u64)
            };
            let mut keyed = scratch::collect(
                order.iter().map(|&i| (pack(i), i)),
                "the sort keys of the valid points",
            )?;
            // Stable, on points in index order: (row, index) order.
            radix_sort(&mut keyed, widths.iter().sum(), |&(key, _)| key)?;
            order.iter_mut().zip(&keyed).for_each(|(o, &(_, i))| *o = i);
        } else {
            // (row, index) is a total order, so an unstable sort gives the same result as a
            // stable sort by row.
            order.sort_unstable_by(|&a, &b| row(a).cmp(row(b)).then(a.cmp(&b)));
        }
        let mut starts = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            if k == 0 || row(order[k - 1]) != row(i) {
                scratch::push(&mut starts, k, "the voxels' first points")?;
            }
        }
        scratch::push(&mut starts, order.len(), "the voxels' first points")?;
        Ok(Voxels { order, starts })
    }

    /// The outputs for the M voxels found.
    fn found_specs(&self, dims: &Dims, v: &Voxels) -> Vec<OutputSpec> {
        dims.specs(v.m())
    }

    fn execute(
        &self,
        dims: Dims,
        v: Voxels,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let feats = inputs.get::<f32>(FEATS)?.data;
        let coors = inputs.get::<i32>(COORS)?.data;
        let voxel_feats = outputs.take::<f32>(0)?;
        let voxel_coors = outputs.take::<i32>(1)?;
        let map = outputs.take::<i32>(2)?;
        let count = outputs.take::<i32>(3)?;
        let voxel_num = outputs.take::<i32>(4)?;
        let (Dims { n, c, d }, m) = (dims, v.m());
        if feats.len() != n * c
            || coors.len() != n * d
            || voxel_feats.len() != m * c
            || voxel_coors.len() != m * d
            || map.len() != n
            || count.len() != m
            || voxel_num.len() != 1
        {
            return Err(Error::Runtime("DynamicScatter: buffers do not match the plan".into()));
        }
        // Index outputs (O(N + M*D), serial). M <= N fits int32 (checked in plan).
        voxel_num[0] = m as i32;
        map.fill(-1);
        for (vox, w) in v.starts.windows(2).enumerate() {
            let points = &v.order[w[0]..w[1]];
            count[vox] = points.len() as i32;
            let first = points[0] as usize;
            voxel_coors[vox * d..(vox + 1) * d].copy_from_slice(&coors[first * d..(first + 1) * d]);
            for &i in points {
                map[i as usize] = vox as i32;
            }
        }
        if c == 0 || m == 0 {
            return Ok(());
        }
        // Blocks of voxels with about GRAIN feature elements each.
        let mut bounds = Vec::new();
        scratch::push(&mut bounds, 0usize, "the voxel blocks' bounds")?;
        let mut done = 0usize;
        for (vox, w) in v.starts.windows(2).enumerate() {
            done += (w[1] - w[0]) * c;
            if done >= GRAIN && vox + 1 < m {
                scratch::push(&mut bounds, (vox + 1) * c, "the voxel blocks' bounds")?;
                done = 0;
            }
        }
        scratch::push(&mut bounds, m * c, "the voxel blocks' bounds")?;
        let (reduce, stream) = (self.reduce, cache::worth_streaming(size_of_val(voxel_feats)));
        let errors = FirstError::default();
        for_each_part_mut(par, voxel_feats, &bounds, |t, part| {
            errors.record(reduce_block(&v, c, feats, reduce, bounds[t] / c, part, stream));
        });
        errors.into_result()
    }
}

/// Points ahead (in voxel order) whose feature rows are prefetched, with the non-temporal
/// hint: the rows are scattered over feats and each is read once.
const AHEAD: usize = 4;

/// Reduces the voxels `first..` whose output rows (of `c` channels) `part` holds, each
/// voxel's points in ascending order. `stream`: write the rows with non-temporal stores.
fn reduce_block(
    v: &Voxels,
    c: usize,
    feats: &[f32],
    reduce: Reduce,
    first: usize,
    part: &mut [f32],
    stream: bool,
) -> Result<()> {
    let feats_row = |i: u32| feats.get(i as usize * c..(i as usize + 1) * c);
    let (Some(&base), Some(&end)) = (v.starts.get(first), v.starts.get(first + part.len() / c))
    else {
        return Ok(());
    };
    let points = v.order.get(base..end).unwrap_or(&[]);
    let prefetch = |k: usize| {
        if let Some(row) = points.get(k).and_then(|&i| feats_row(i)) {
            cache::prefetch_stream(row, c);
        }
    };
    (0..AHEAD).for_each(prefetch);
    // Each row is built in L1, then copied out (streamed when large: written once).
    let mut acc = scratch::filled(c, 0f32, "a voxel's feature row")?;
    let mut k = 0;
    for (vox, out) in part.chunks_exact_mut(c).enumerate() {
        let count = v.starts[first + vox + 1] - v.starts[first + vox];
        acc.fill(if reduce == Reduce::Max { f32::NEG_INFINITY } else { 0.0 });
        for &i in points.get(k..k + count).unwrap_or(&[]) {
            prefetch(k + AHEAD);
            k += 1;
            let f = feats_row(i).unwrap_or(&[]);
            match reduce {
                // NaN never compares greater, so it never wins. A select, not a branch, so
                // it vectorises.
                Reduce::Max => {
                    acc.iter_mut().zip(f).for_each(|(o, &x)| *o = if x > *o { x } else { *o })
                }
                Reduce::Sum | Reduce::Mean => acc.iter_mut().zip(f).for_each(|(o, &x)| *o += x),
            }
        }
        if reduce == Reduce::Mean {
            let count = count as f32;
            acc.iter_mut().for_each(|o| *o /= count);
        }
        cache::copy_out(out, &acc, stream);
    }
    cache::stream_fence();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::AttrValue;
    use crate::tensor::Tensor;
    use std::collections::HashMap;

    /// The voxels (point order) that `plan` finds, for coordinates of `d` columns.
    fn voxels(coors: Vec<i32>, d: usize) -> Vec<Vec<u32>> {
        let n = coors.len() / d;
        let feats = Tensor::f32([n, 1], vec![0.0; n]);
        let coors = Tensor::i32([n, d], coors);
        let inputs = Inputs::new(
            vec!["feats".into(), "coors".into()],
            vec![Some(feats.view()), Some(coors.view())],
        )
        .unwrap();
        let attrs = HashMap::from([("reduce_type".to_owned(), AttrValue::String("max".into()))]);
        let op = DynamicScatter::from_attributes(&Attrs::new(
            crate::ops::schema("DynamicScatter"),
            &attrs,
        ))
        .unwrap();
        let (_, _, v) = op.plan(&inputs, &crate::parallel::Serial).unwrap();
        v.starts.windows(2).map(|w| v.order[w[0]..w[1]].to_vec()).collect()
    }

    /// The packed-key sort and the row comparison give the same voxels in the same order:
    /// rows compared as the contract says (ascending coordinates, points in index order),
    /// whether the columns' widths fit 64 bits together or not (two rows of 2^30 in every
    /// column at D = 3, 2^16 at D = 4, 2^8 at D = 8), with radix sorts of one digit, of six
    /// (four 16-bit columns: exactly 64 bits) and with a zero-width column.
    #[test]
    fn packed_keys_and_row_comparison_order_voxels_alike() {
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        // (D, the values each coordinate is drawn from, the first column all 0, a value too
        // wide to pack).
        let cases: [(usize, &[i32], bool, Option<i32>); 7] = [
            (1, &[-1, 0, 1, 2, 3], false, None),
            (2, &[-1, 0, 1, 2, 3, 4, 5], false, None),
            (3, &[-1, 0, 1, 2, 3, 4], false, Some(1 << 30)),
            (4, &[-1, 0, 1, 2], false, Some(1 << 16)),
            (8, &[-1, 0], false, Some(1 << 8)),
            // Widths 16 + 16 + 16 + 16: keys of exactly 64 bits.
            (4, &[0, 1, 40_000, 65_535], false, None),
            // Widths 0 + 31 + 31.
            (3, &[0, 5, 1 << 30, i32::MAX], true, None),
        ];
        for (d, values, zero_first, big) in cases {
            for big in std::iter::once(None).chain(big.map(Some)) {
                // More than 256 kept points, so the radix sort runs (not its small-input path).
                let n = 2000;
                let mut coors: Vec<i32> =
                    (0..n * d).map(|_| values[(next() % values.len() as u64) as usize]).collect();
                if zero_first {
                    coors.chunks_exact_mut(d).for_each(|r| r[0] = 0);
                }
                if let Some(big) = big {
                    coors[d * 7..d * 8].fill(big);
                    coors[d * 9..d * 10].fill(big);
                    coors[d * 11 + d - 1] = big;
                }
                let rows: Vec<&[i32]> = coors.chunks_exact(d).collect();
                let mut want: Vec<u32> =
                    (0..n as u32).filter(|&i| rows[i as usize].iter().all(|&x| x >= 0)).collect();
                want.sort_by(|&a, &b| rows[a as usize].cmp(rows[b as usize]).then(a.cmp(&b)));
                let mut grouped: Vec<Vec<u32>> = Vec::new();
                for &i in &want {
                    match grouped.last_mut() {
                        Some(g) if rows[g[0] as usize] == rows[i as usize] => g.push(i),
                        _ => grouped.push(vec![i]),
                    }
                }
                assert_eq!(voxels(coors.clone(), d), grouped, "D {d}, largest coordinate {big:?}");
            }
        }
    }
}

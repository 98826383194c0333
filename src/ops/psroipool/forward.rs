//! PsRoiPool (R-FCN position-sensitive RoI pooling forward, NHWC; schemas/psroipool/psroipool.json),
//! the partner of PsRoiPoolBackward: same attributes, same bins (computed by the backward
//! module's code, so the two ops can never disagree on a bin edge), and the mapping_channel
//! the backward op consumes.
//!
//! Output channel o of bin (i, j) averages input channel c = (o*ph + i)*pw + j over the bin.
//! Tasks own whole rois. For one bin the pixels are visited rows then columns, and each
//! pixel's channel vector is read once for all o, so every output sums its pixels in the
//! contract's order. In NHWC a bin's od channels lie ph*pw floats apart, one cache line
//! each; when the rois read more of those lines than re-laying the input costs, each pixel's
//! channels are first re-laid in bin order ([ph*pw][od], a bin's channels contiguous) in a
//! scratch copy. The sums and their order are the same either way, so is the result.
//! On the card: MLU-OPS only (mluops.rs).

use super::Dims;
use super::backward::{PsRoiPoolBackward, Span, batch_error, batch_rule};
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, RowValues, ValueRule};
use crate::parallel::{Parallel, for_each_chunk_mut};
use crate::schema::Attrs;
use crate::scratch;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Input elements read per task, roughly.
const GRAIN: usize = 64 * 1024;

/// Descriptor: the same validated attributes as PsRoiPoolBackward.
#[derive(Debug, Clone, PartialEq)]
pub struct PsRoiPool(pub PsRoiPoolBackward);

impl PsRoiPool {
    /// Whether re-laying the input in bin order reads fewer cache lines than the rois' bins
    /// read in NHWC, where each of a bin pixel's od channels is its own line once ph*pw
    /// floats span one: the pixels the bins visit, times od lines in NHWC or the lines of od
    /// contiguous floats re-laid, plus reading and writing the input once to re-lay it.
    fn relayout_pays(&self, rois: &[f32], height: usize, width: usize, input_len: usize) -> bool {
        const LINE: usize = 16; // floats per 64-byte cache line
        let d = &self.0;
        if d.pooled * d.pooled < LINE {
            return false;
        }
        let (mut rows, mut cols) =
            (vec![Span::default(); d.pooled], vec![Span::default(); d.pooled]);
        let mut visits = 0usize;
        for roi in rois.chunks_exact(5) {
            if PsRoiPoolBackward::finite_batch(roi).is_some()
                && d.roi_spans(roi, height, width, &mut rows, &mut cols).is_some()
            {
                let (h, w) = (
                    rows.iter().map(|s| s.len()).sum::<usize>(),
                    cols.iter().map(|s| s.len()).sum::<usize>(),
                );
                visits = visits.saturating_add(h.saturating_mul(w));
            }
        }
        let od = d.output_dim;
        visits.saturating_mul(od)
            > visits.saturating_mul(od.div_ceil(LINE)).saturating_add(input_len / LINE * 2)
    }

    pub fn new(
        pooled_height: i64,
        pooled_width: i64,
        spatial_scale: f32,
        output_dim: i64,
    ) -> Result<Self> {
        PsRoiPoolBackward::new(pooled_height, pooled_width, spatial_scale, output_dim)
            .map(PsRoiPool)
    }
}

impl Operator for PsRoiPool {
    const NAME: &'static str = "PsRoiPool";
    const SCHEMA: &'static str = include_str!("../../../schemas/psroipool/psroipool.json");
    type Dims = Dims;
    type Found = ();

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        <PsRoiPoolBackward as Operator>::from_attributes(attrs).map(PsRoiPool)
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        let d = &self.0;
        let input = inputs.shaped::<f32>(
            0,
            &[None, None, None, None],
            "[batches, height, width, channels]",
        )?;
        let [batches, height, width, channels] = input[..] else { unreachable!("rank checked") };
        if channels != d.channels {
            return Err(inputs.error(
                0,
                format!(
                    "channels ({channels}) must equal pooled_height * pooled_width * output_dim = {} * {} * {} = {}",
                    d.pooled, d.pooled, d.output_dim, d.channels
                ),
            ));
        }
        let r = inputs.shaped::<f32>(1, &[None, Some(5)], "[R, 5]")?[0];
        let numel =
            r.checked_mul(d.channels).filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if numel.is_none() {
            return Err(Error::output(
                "output",
                format!("[R, ph, pw, output_dim] with R = {r} is too large"),
            ));
        }
        Ok(Dims { rois: r, batches, height, width })
    }

    /// output and mapping_channel, both [R, ph, pw, output_dim].
    fn output_specs(&self, dims: &Dims) -> Vec<OutputSpec> {
        let d = &self.0;
        let shape = [dims.rois, d.pooled, d.pooled, d.output_dim];
        vec![OutputSpec::new(DType::F32, shape), OutputSpec::new(DType::I32, shape)]
    }

    fn value_rules(&self, dims: &Dims) -> Vec<ValueRule> {
        vec![batch_rule(1, dims.batches)]
    }

    fn describe(&self, inputs: &Inputs<'_>, dims: &Dims, broken: &Broken) -> Error {
        match &broken.values {
            RowValues::F32(roi) => batch_error(inputs, 1, broken.row, roi, dims.batches),
            values => {
                Error::Runtime(format!("PsRoiPool: value rule {} reported {values:?}", broken.rule))
            }
        }
    }

    fn find(&self, _: &Inputs<'_>, _: &Dims, _: &dyn Parallel) -> Result<()> {
        Ok(())
    }

    fn execute(
        &self,
        dims: Dims,
        (): (),
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let d = &self.0;
        let input = inputs.get::<f32>(0)?.data;
        let rois = inputs.get::<f32>(1)?.data;
        let out = outputs.take::<f32>(0)?;
        let mapping = outputs.take::<i32>(1)?;
        let Dims { rois: r_count, height, width, .. } = dims;
        let (p, od, channels) = (d.pooled, d.output_dim, d.channels);
        let per_roi = p * p * od;
        if out.len() != r_count * per_roi || mapping.len() != out.len() || rois.len() != r_count * 5
        {
            return Err(Error::Runtime("PsRoiPool: buffers do not match the plan".into()));
        }
        // mapping_channel[r, i, j, o] = (o*p + i)*p + j < channels for every roi.
        if channels > i32::MAX as usize {
            return Err(Error::input(
                "input",
                format!("channels = {channels} does not fit int32 mapping_channel"),
            ));
        }
        // Every roi's block is the same: computed once (the divisions cost more than the
        // pooling at small bins), then copied.
        let pattern = scratch::collect(
            (0..per_roi).map(|e| {
                let (ij, o) = (e / od, e % od);
                ((o * p + ij / p) * p + ij % p) as i32
            }),
            "one roi's mapping_channel",
        )?;
        for_each_chunk_mut(par, mapping, per_roi.max(1) * 64, |_, chunk| {
            for block in chunk.chunks_exact_mut(per_roi.max(1)) {
                block.copy_from_slice(&pattern);
            }
        });
        if out.is_empty() {
            return Ok(());
        }
        let pp = p * p;
        let relaid = if self.relayout_pays(rois, height, width, input.len()) {
            // A failed allocation only costs the faster layout.
            scratch::filled(input.len(), 0f32, "PsRoiPool's bin-ordered input").ok().map(|mut t| {
                let pixels_per_task = (GRAIN / channels.max(1)).max(1);
                for_each_chunk_mut(par, &mut t, pixels_per_task * channels, |c, chunk| {
                    let first = c * pixels_per_task;
                    for (k, dst) in chunk.chunks_exact_mut(channels).enumerate() {
                        let src = &input[(first + k) * channels..(first + k + 1) * channels];
                        for (ij, bin) in dst.chunks_exact_mut(od).enumerate() {
                            for (o, v) in bin.iter_mut().enumerate() {
                                *v = src[o * pp + ij];
                            }
                        }
                    }
                });
                t
            })
        } else {
            None
        };
        // Where bin (i, j)'s channel o of a pixel is, from the pixel's first value: ij + o*pp
        // in NHWC, ij*od + o re-laid.
        let (source, bin_at, o_stride) = match &relaid {
            Some(t) => (t.as_slice(), od, 1),
            None => (input, 1, pp),
        };
        let pixel_len = channels;
        // Rois per task: enough bins' pixels to amortise scheduling (a roi reads about
        // its area * channels / (p*p) * p*p input values).
        let area = (height * width).max(1);
        let rois_per_task = (GRAIN / (per_roi + area.min(GRAIN))).max(1);
        for_each_chunk_mut(par, out, rois_per_task * per_roi, |t, chunk| {
            let mut rows = vec![Span::default(); p];
            let mut cols = vec![Span::default(); p];
            let mut acc = vec![0f32; od];
            for (k, block) in chunk.chunks_exact_mut(per_roi).enumerate() {
                let r = t * rois_per_task + k;
                let roi = &rois[r * 5..r * 5 + 5];
                block.fill(0.0);
                // plan checked a finite batch lies in [0, batches).
                let Some(b) = PsRoiPoolBackward::finite_batch(roi) else { continue };
                if d.roi_spans(roi, height, width, &mut rows, &mut cols).is_none() {
                    continue;
                }
                let b = b as usize;
                for (i, rs) in rows.iter().enumerate() {
                    for (j, cs) in cols.iter().enumerate() {
                        if rs.len() == 0 || cs.len() == 0 {
                            continue;
                        }
                        acc.fill(0.0);
                        let first = (i * p + j) * bin_at;
                        for h in rs.start..rs.end {
                            let row = ((b * height + h) * width) * pixel_len;
                            for w in cs.start..cs.end {
                                let pixel = &source[row + w * pixel_len..row + (w + 1) * pixel_len];
                                if o_stride == 1 {
                                    for (a, v) in acc.iter_mut().zip(&pixel[first..first + od]) {
                                        *a += v;
                                    }
                                } else {
                                    for (o, a) in acc.iter_mut().enumerate() {
                                        *a += pixel[first + o * o_stride];
                                    }
                                }
                            }
                        }
                        let bin_area = (rs.len() * cs.len()) as f32;
                        let dst = &mut block[(i * p + j) * od..(i * p + j + 1) * od];
                        for (o, a) in dst.iter_mut().zip(&acc) {
                            *o = a / bin_area;
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

//! What both PsRoiPool targets draw: attributes and rois, with the contract's rules for them
//! (schemas/psroipool/*.json): attributes valid unless pooled_width != pooled_height; a roi
//! with all five values finite must have its truncated batch id in [0, batches).

use onnxruntime_ep_mlu_fuzz::Bytes;
use onnxruntime_ep_mlu_fuzz::common::psroi::Attrs;

/// Attributes, and whether they are valid.
pub fn attrs(u: &mut Bytes) -> (Attrs, bool) {
    let p = 1 + u.below(3) as i64;
    let scale = [1.0, 0.5, 0.25, 2.0, 0.0625][u.below(5)];
    let mut a = Attrs::square(p, scale, 1 + u.below(3) as i64);
    let valid = !u.one_in(16);
    if !valid {
        a.pw += 1;
    }
    (a, valid)
}

/// `r` rois over `batches` images (coordinates from the float palette: some non-finite),
/// and whether they are valid.
pub fn rois(u: &mut Bytes, r: usize, batches: usize) -> (Vec<f32>, bool) {
    let mut rois = Vec::with_capacity(r * 5);
    let mut valid = true;
    for _ in 0..r {
        let batch = match u.below(12) {
            0 => -1.0,
            1 => batches as f32,
            2 => -0.5,
            k => u.below(batches) as f32 + if k == 3 { 0.75 } else { 0.0 },
        };
        let coords = [u.float(), u.float(), u.float(), u.float()].map(|x| x * 2.0);
        let finite = batch.is_finite() && coords.iter().all(|x| x.is_finite());
        valid &= !finite || (0.0..batches as f32).contains(&batch.trunc());
        rois.push(batch);
        rois.extend(coords);
    }
    (rois, valid)
}

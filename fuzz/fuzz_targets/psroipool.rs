//! PsRoiPool: attributes, feature map, rois (non-finite values, batch ids outside the batch)
//! from the fuzzer's bytes; every path against the CPU kernel, the CPU kernel against the
//! suite's references (tests/reference/): mapping exact, output bit for bit against the
//! contract's float32 sum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::tensor::Tensor;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, bits, check, common, outcome};

mod psroi;
#[path = "../../tests/reference/psroipool.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, reference};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let (a, attrs_valid) = psroi::attrs(&mut u);
    let (batches, height, width) = (1 + u.below(2), 1 + u.below(6), 1 + u.below(6));
    let channels = (a.ph * a.ph * a.od) as usize + usize::from(u.one_in(16));
    let shape = [batches, height, width, channels];
    let input = u.floats(shape.iter().product());
    let r = u.below(5);
    let (rois, rois_valid) = psroi::rois(&mut u, r, batches);
    let case = Case { shape, input, r, rois };
    let valid = attrs_valid && rois_valid && channels == a.channels();
    let (x, rois) = case.tensors();
    if let Some(out) =
        outcome(check("PsRoiPool", &a.map(), &[Some(x), Some(rois)], Class::Exact), valid)
    {
        let want = reference(&case, a);
        assert_eq!(
            out[1].data.i32().expect("int32 mapping_channel"),
            want.mapping,
            "mapping_channel against the reference"
        );
        let sum = Tensor::f32(out[0].shape.clone(), want.out32);
        assert_eq!(bits(&out[0]), bits(&sum), "output against the contract's float32 sum");
    }
});

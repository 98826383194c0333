//! The attributes shared by PsRoiPool and PsRoiPoolBackward, as the tests of both build them.

use onnxruntime_ep_mlu::ops::{Operator, descriptor};
use onnxruntime_ep_mlu::schema::AttrValue;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
pub struct Attrs {
    pub ph: i64,
    pub pw: i64,
    pub scale: f32,
    pub od: i64,
}

impl Attrs {
    pub fn square(p: i64, scale: f32, od: i64) -> Self {
        Attrs { ph: p, pw: p, scale, od }
    }
    pub fn map(self) -> HashMap<String, AttrValue> {
        HashMap::from([
            ("pooled_height".to_string(), AttrValue::Int(self.ph)),
            ("pooled_width".to_string(), AttrValue::Int(self.pw)),
            ("spatial_scale".to_string(), AttrValue::Float(self.scale)),
            ("output_dim".to_string(), AttrValue::Int(self.od)),
        ])
    }
    /// The operator's descriptor (valid attributes expected).
    pub fn op<O: Operator>(self) -> O {
        descriptor(&self.map()).expect("valid attributes")
    }
    /// Channels of the feature map the contract requires: ph * pw * output_dim.
    pub fn channels(self) -> usize {
        (self.ph * self.pw * self.od) as usize
    }
}

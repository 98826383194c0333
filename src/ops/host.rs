//! Output buffers for hosts outside ONNX Runtime (the Rust API, tests, benches, the card
//! driver's host fallback).

use crate::error::Result;
use crate::tensor::{OutData, OutputHost, OutputSpec, Outputs, OwnedData, Tensor};

/// Owned buffers for hosts outside ONNX Runtime. New buffers are poisoned (see
/// [`OwnedData::poisoned`]); a host that runs the same shapes again reuses its buffers
/// as they are, as ONNX Runtime's arena does.
#[derive(Default)]
pub struct OwnedOutputs {
    /// The outputs' names, for errors (may be empty).
    pub names: Vec<String>,
    pub specs: Vec<OutputSpec>,
    pub data: Vec<OwnedData>,
}

impl OutputHost for OwnedOutputs {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        if self.specs != specs || self.data.len() != specs.len() {
            self.data = Vec::new();
            for (i, spec) in specs.iter().enumerate() {
                let name = self.names.get(i).map_or_else(|| i.to_string(), |n| format!("'{n}'"));
                self.data.push(OwnedData::poisoned(
                    spec,
                    &format!("output {name} ({:?} {:?})", spec.dtype, spec.shape),
                )?);
            }
            self.specs = specs.to_vec();
        }
        Ok(Outputs::new(self.names.clone(), self.data.iter_mut().map(OwnedData::as_out).collect()))
    }
}

impl OwnedOutputs {
    pub fn named(names: Vec<String>) -> Self {
        OwnedOutputs { names, ..Default::default() }
    }
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.specs
            .into_iter()
            .zip(self.data)
            .map(|(s, data)| Tensor { shape: s.shape, data })
            .collect()
    }
}

/// [`OwnedOutputs`] whose outputs start on a 64-byte line, as onnxruntime's CPU allocator
/// hands them out (a plain Vec starts wherever the allocator puts it, often 16 bytes into
/// one): kernels write whole lines with non-temporal stores only where rows start on a
/// line, so benches and tests called directly take the paths sessions take.
#[derive(Default)]
pub struct LineAlignedOutputs {
    owned: OwnedOutputs,
    /// Where each output starts in its buffer, in elements.
    starts: Vec<usize>,
}

impl OutputHost for LineAlignedOutputs {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        if self.owned.specs != specs {
            // 64 elements of at least a byte reach the next line from anywhere.
            let padded: Vec<OutputSpec> = specs
                .iter()
                .map(|s| OutputSpec::new(s.dtype, [s.numel().saturating_add(64)]))
                .collect();
            self.owned.allocate(&padded)?;
            self.starts = self
                .owned
                .data
                .iter()
                .zip(specs)
                .map(|(d, s)| d.as_ptr().cast::<u8>().align_offset(64) / s.dtype.size())
                .collect();
            self.owned.specs = specs.to_vec();
        }
        let parts = self.owned.data.iter_mut().zip(&self.starts).zip(specs).map(|((d, &at), s)| {
            let part = at..at + s.numel();
            match d {
                OwnedData::F32(v) => OutData::F32(&mut v[part]),
                OwnedData::F16(v) => OutData::F16(&mut v[part]),
                OwnedData::I32(v) => OutData::I32(&mut v[part]),
                OwnedData::I64(v) => OutData::I64(&mut v[part]),
            }
        });
        Ok(Outputs::new(self.owned.names.clone(), parts.collect()))
    }
}

impl LineAlignedOutputs {
    /// The outputs of the last run, their buffers cut to them (in place).
    pub fn into_tensors(self) -> Vec<Tensor> {
        fn cut<T>(mut v: Vec<T>, at: usize, len: usize) -> Vec<T> {
            v.drain(..at);
            v.truncate(len);
            v
        }
        let parts = self.owned.data.into_iter().zip(self.starts).zip(self.owned.specs).map(
            |((d, at), s)| {
                let len = s.numel();
                let data = match d {
                    OwnedData::F32(v) => OwnedData::F32(cut(v, at, len)),
                    OwnedData::F16(v) => OwnedData::F16(cut(v, at, len)),
                    OwnedData::I32(v) => OwnedData::I32(cut(v, at, len)),
                    OwnedData::I64(v) => OwnedData::I64(cut(v, at, len)),
                };
                Tensor { shape: s.shape, data }
            },
        );
        parts.collect()
    }
}

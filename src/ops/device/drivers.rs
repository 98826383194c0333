//! The host-tensor drivers of the tests and benches: a node run on a card through the
//! provider's node runner, with inputs and outputs in host memory.

use super::{Bang, BangOperator, CardBackends, CardNode, DeviceOutputs, Ran, path};
use crate::error::{Error, Result};
use crate::mlu::{Buffer, Device};
use crate::ops::operator::Kernel;
use crate::tensor::{CardTensor, OutputSpec, OwnedData, Tensor};
use std::ffi::c_void;
use std::sync::Arc;

/// Host-tensor driver: uploads the inputs, runs `node` on `device` through the one node
/// runner the provider uses ([`CardNode::run`]), downloads the outputs; and where it ran.
pub fn run_node_on_device(
    device: &Arc<Device>,
    node: &CardNode,
    inputs: &[Option<&Tensor>],
) -> Result<(Vec<Tensor>, Ran)> {
    let mut uploaded = Vec::new();
    for t in inputs {
        uploaded.push(match t {
            None => None,
            Some(t) => Some(match &t.data {
                OwnedData::F32(d) => device.upload(d)?,
                OwnedData::F16(d) => device.upload(d)?,
                OwnedData::I32(d) => device.upload(d)?,
                OwnedData::I64(d) => device.upload(d)?,
            }),
        });
    }
    let tensors: Vec<Option<CardTensor>> = inputs
        .iter()
        .zip(&uploaded)
        .map(|(t, b)| {
            t.zip(b.as_ref()).map(|(t, b)| CardTensor {
                dtype: t.data.as_data().dtype(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                data: b.ptr(),
            })
        })
        .collect();
    struct Outs {
        device: Arc<Device>,
        bufs: Vec<Option<(OutputSpec, Buffer)>>,
        scratch: Vec<Buffer>,
    }
    impl DeviceOutputs for Outs {
        fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void> {
            let buf = self.device.alloc(spec.bytes())?;
            let ptr = buf.ptr();
            if self.bufs.len() <= index {
                self.bufs.resize_with(index + 1, || None);
            }
            self.bufs[index] = Some((spec.clone(), buf));
            Ok(ptr)
        }
        fn workspace(&mut self, bytes: usize) -> Result<*mut c_void> {
            self.device.alloc_kept(bytes, &mut self.scratch)
        }
    }
    let mut outs = Outs { device: Arc::clone(device), bufs: Vec::new(), scratch: Vec::new() };
    let queue = device.queue()?;
    let names = node.schema.input_names();
    let (ran, result) = node.run(device, &queue, names, &tensors, &mut outs);
    result?;
    let ran = ran.ok_or_else(|| Error::Runtime(format!("{}: ran on no path", node.op)))?;
    let mut result = Vec::new();
    for (i, slot) in outs.bufs.into_iter().enumerate() {
        let (spec, buf) = slot.ok_or_else(|| {
            Error::Runtime(format!("{}: output {i} was never allocated", node.op))
        })?;
        let mut data = OwnedData::poisoned(&spec, &format!("host copy of output {i}"))?;
        match &mut data {
            OwnedData::F32(v) => device.download(&buf, v)?,
            OwnedData::F16(v) => device.download(&buf, v)?,
            OwnedData::I32(v) => device.download(&buf, v)?,
            OwnedData::I64(v) => device.download(&buf, v)?,
        }
        result.push(Tensor { shape: spec.shape, data });
    }
    Ok((result, ran))
}

/// Runs `op` on our BANG kernels on `device` (the tests' driver): an error unless the node
/// ran on the card.
pub fn run_on_device<O: BangOperator + Clone>(
    device: &Arc<Device>,
    op: &O,
    inputs: &[Option<&Tensor>],
) -> Result<Vec<Tensor>> {
    let backends = CardBackends::bang();
    let op = Arc::new(op.clone());
    let path = path::<O, Bang>(&op, &backends);
    let cpu: Arc<dyn Kernel> = op;
    let node = CardNode {
        op: O::NAME,
        schema: O::schema(),
        cpu,
        paths: vec![path],
        elsewhere: Vec::new(),
        size_inputs: O::SIZE_INPUTS,
    };
    node.paths[0].supported().map_err(|why| {
        Error::Runtime(format!("{}: not supported by the BANG kernels: {why}", O::NAME))
    })?;
    match run_node_on_device(device, &node, inputs)? {
        (outputs, Ran::Card(..)) => Ok(outputs),
        (_, Ran::Host(why)) => {
            Err(Error::Runtime(format!("{}: ran on the host, not the card: {why}", O::NAME)))
        }
    }
}

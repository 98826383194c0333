//! `MLUExecutionProvider`: the plugin execution provider. ONNX Runtime calls
//! `CreateEpFactories` (src/lib.rs) and gets one [`factory::Factory`], which reports the
//! MLU cards (real ones through libcnrt, or the emulated card when `MLU_EP_EMULATE=1`) as
//! NPU hardware devices and creates [`provider::Ep`] instances. Each EP claims the `mluops`
//! nodes whose configuration a card backend (MLU-OPS or our BANG kernels) supports
//! (`GetCapability`) and runs them through a kernel registry ([`kernel`]) on the card, with
//! device memory, an allocator and a data transfer ([`memory`]) so that tensors stay on the
//! card between MLU nodes.
//!
//! This module is the EP's policy (what to claim and why, which card, the MLU->CPU fallback,
//! the copy directions) and the callbacks ONNX Runtime calls; every ONNX Runtime call it
//! makes goes through `crate::ffi`.

pub mod doctor;
pub mod factory;
pub mod kernel;
pub mod memory;
pub mod provider;
pub mod traffic;

pub const EP_NAME: &str = "MLUExecutionProvider";
pub const VENDOR: &str = "Cambricon";
/// Cambricon's PCI vendor id.
pub const VENDOR_ID: u32 = 0xCABC;
/// Prefix of this EP's options in the session configuration (ONNX Runtime stores the
/// options given with a provider as `ep.<lowercased ep name>.<key>`).
pub const OPTION_PREFIX: &str = "ep.mluexecutionprovider.";

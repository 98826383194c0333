//! The EP's kernel registry: kernel definitions built through `OrtEpApi`'s kernel-def
//! builder, each with the function ONNX Runtime calls to create its kernel.

use super::ep_abi::{OrtKernelCreateFunc, OrtKernelDefBuilder, OrtKernelRegistry};
use super::{checked, cstring, ep_api};
use crate::error::Result;
use crate::schema;
use ort_sys::OrtMemType;
use std::ffi::c_void;

/// A kernel registry, released on drop.
pub struct KernelRegistry(*mut OrtKernelRegistry);

// SAFETY: built once, then only read by ONNX Runtime.
unsafe impl Send for KernelRegistry {}
// SAFETY: as above.
unsafe impl Sync for KernelRegistry {}

impl Drop for KernelRegistry {
    fn drop(&mut self) {
        // SAFETY: created by CreateKernelRegistry and released once.
        unsafe { (ep_api().ReleaseKernelRegistry)(self.0) };
    }
}

struct Builder(*mut OrtKernelDefBuilder);

impl Drop for Builder {
    fn drop(&mut self) {
        // SAFETY: created by CreateKernelDefBuilder and released once.
        unsafe { (ep_api().ReleaseKernelDefBuilder)(self.0) };
    }
}

/// Where a kernel wants one of its tensors in host memory.
pub enum HostSide {
    None,
    Input0,
    Output0,
}

impl KernelRegistry {
    pub fn new() -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        checked("CreateKernelRegistry", unsafe { (ep_api().CreateKernelRegistry)(&mut raw) })?;
        Ok(KernelRegistry(raw))
    }

    pub fn as_ptr(&self) -> *const OrtKernelRegistry {
        self.0
    }

    /// Adds one kernel of EP `ep_name` for `op` in `domain`, opset 1 and later.
    ///
    /// # Safety
    /// `create` must accept `state`, which must stay valid as long as the registry.
    pub unsafe fn add(
        &self,
        op: &str,
        domain: &str,
        ep_name: &str,
        host: HostSide,
        create: OrtKernelCreateFunc,
        state: *mut c_void,
    ) -> Result<()> {
        let ep = ep_api();
        let mut b = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        checked("CreateKernelDefBuilder", unsafe { (ep.CreateKernelDefBuilder)(&mut b) })?;
        let builder = Builder(b);
        let (op, domain, ep_name) = (cstring(op), cstring(domain), cstring(ep_name));
        let mut def = std::ptr::null_mut();
        // SAFETY: the builder is live; the strings outlive the calls (ORT copies them).
        unsafe {
            checked(
                "SetOperatorType",
                (ep.KernelDefBuilder_SetOperatorType)(builder.0, op.as_ptr()),
            )?;
            checked("SetDomain", (ep.KernelDefBuilder_SetDomain)(builder.0, domain.as_ptr()))?;
            checked(
                "SetSinceVersion",
                (ep.KernelDefBuilder_SetSinceVersion)(builder.0, schema::OPSET_VERSION, i32::MAX),
            )?;
            checked(
                "SetExecutionProvider",
                (ep.KernelDefBuilder_SetExecutionProvider)(builder.0, ep_name.as_ptr()),
            )?;
            match host {
                HostSide::None => {}
                HostSide::Input0 => checked(
                    "SetInputMemType",
                    (ep.KernelDefBuilder_SetInputMemType)(
                        builder.0,
                        0,
                        OrtMemType::OrtMemTypeCPUInput,
                    ),
                )?,
                HostSide::Output0 => checked(
                    "SetOutputMemType",
                    (ep.KernelDefBuilder_SetOutputMemType)(
                        builder.0,
                        0,
                        OrtMemType::OrtMemTypeCPUOutput,
                    ),
                )?,
            }
            checked("KernelDefBuilder_Build", (ep.KernelDefBuilder_Build)(builder.0, &mut def))?;
        }
        // SAFETY: registry and def are live; `state` outlives the registry (caller contract).
        let added = checked("KernelRegistry_AddKernel", unsafe {
            (ep.KernelRegistry_AddKernel)(self.0, def, create, state)
        });
        // SAFETY: the registry keeps its own reference to the definition.
        unsafe { (ep.ReleaseKernelDef)(def) };
        added
    }
}

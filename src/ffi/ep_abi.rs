//! Hand-written bindings for the plugin execution-provider side of ONNX Runtime's C ABI
//! (`onnxruntime_ep_c_api.h`), which ort-sys leaves opaque. Written from the header's
//! member order and the version each member appeared in; only the members up to API
//! version 24 (our floor) are declared, because every struct below is read by ONNX Runtime
//! only up to the `ort_version_supported` we write into it, and the one table we read
//! (`OrtEpApi`) is used only up to the 1.24 members. The layout tests at the bottom pin
//! every offset: a wrong member order would otherwise show up as a call to the wrong
//! function far from its cause.

#![allow(non_snake_case, non_camel_case_types)]

use ort_sys::OrtEpDevice;
use ort_sys::{
    ONNXTensorElementDataType, OrtAllocator, OrtCustomOpDomain, OrtDeviceMemoryType, OrtGraph,
    OrtHardwareDevice, OrtHardwareDeviceType, OrtKernelContext, OrtKernelInfo, OrtKeyValuePairs,
    OrtLogger, OrtMemType, OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtNode, OrtRunOptions,
    OrtSessionOptions, OrtStatusPtr, OrtSyncStream, OrtValue,
};
use std::ffi::{c_char, c_int, c_void};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    OrtMemoryDevice,
    OrtEpGraphSupportInfo,
    OrtKernelRegistry,
    OrtKernelDefBuilder,
    OrtKernelDef,
    OrtDataType,
    OrtSyncStreamImpl,
    OrtNodeComputeInfo,
    OrtSharedPrePackedWeightCache,
    OrtDeviceEpIncompatibilityDetails,
    OrtExternalResourceImporterImpl,
    OrtNodeComputeContext
);

/// A table slot this library never calls; declared only to keep the offsets right.
pub type Unused = usize;

pub type OrtKernelCreateFunc = unsafe extern "system" fn(
    state: *mut c_void,
    info: *const OrtKernelInfo,
    kernel: *mut *mut OrtKernelImpl,
) -> OrtStatusPtr;

/// `OrtApi::GetEpApi()`: the 1.22..=1.24 members, in header order.
#[repr(C)]
pub struct OrtEpApi {
    // 1.22
    pub CreateEpDevice: unsafe extern "system" fn(
        factory: *mut OrtEpFactory,
        hardware_device: *const OrtHardwareDevice,
        ep_metadata: *const OrtKeyValuePairs,
        ep_options: *const OrtKeyValuePairs,
        ep_device: *mut *mut OrtEpDevice,
    ) -> OrtStatusPtr,
    pub ReleaseEpDevice: unsafe extern "system" fn(device: *mut OrtEpDevice),
    // 1.23
    pub EpGraphSupportInfo_AddNodesToFuse: Unused,
    pub EpGraphSupportInfo_AddSingleNode: unsafe extern "system" fn(
        info: *mut OrtEpGraphSupportInfo,
        node: *const OrtNode,
    ) -> OrtStatusPtr,
    pub NodeComputeContext_NodeName: Unused,
    pub EpDevice_AddAllocatorInfo: unsafe extern "system" fn(
        device: *mut OrtEpDevice,
        memory_info: *const OrtMemoryInfo,
    ) -> OrtStatusPtr,
    pub MemoryInfo_GetMemoryDevice:
        unsafe extern "system" fn(info: *const OrtMemoryInfo) -> *const OrtMemoryDevice,
    pub Value_GetMemoryDevice:
        unsafe extern "system" fn(value: *const OrtValue) -> *const OrtMemoryDevice,
    pub MemoryDevice_AreEqual:
        unsafe extern "system" fn(a: *const OrtMemoryDevice, b: *const OrtMemoryDevice) -> bool,
    pub MemoryDevice_GetDeviceType:
        unsafe extern "system" fn(d: *const OrtMemoryDevice) -> OrtMemoryInfoDeviceType,
    pub MemoryDevice_GetMemoryType:
        unsafe extern "system" fn(d: *const OrtMemoryDevice) -> OrtDeviceMemoryType,
    pub MemoryDevice_GetVendorId: unsafe extern "system" fn(d: *const OrtMemoryDevice) -> u32,
    pub MemoryDevice_GetDeviceId: unsafe extern "system" fn(d: *const OrtMemoryDevice) -> u32,
    pub SyncStream_GetImpl: Unused,
    pub SyncStream_GetSyncId: Unused,
    pub GetSyncIdForLastWaitOnSyncStream: Unused,
    // 1.24
    pub CreateHardwareDevice: unsafe extern "system" fn(
        kind: OrtHardwareDeviceType,
        vendor_id: u32,
        device_id: u32,
        vendor_name: *const c_char,
        metadata: *const OrtKeyValuePairs,
        device: *mut *mut OrtHardwareDevice,
    ) -> OrtStatusPtr,
    pub ReleaseHardwareDevice: unsafe extern "system" fn(device: *mut OrtHardwareDevice),
    pub CreateKernelRegistry:
        unsafe extern "system" fn(registry: *mut *mut OrtKernelRegistry) -> OrtStatusPtr,
    pub ReleaseKernelRegistry: unsafe extern "system" fn(registry: *mut OrtKernelRegistry),
    pub KernelRegistry_AddKernel: unsafe extern "system" fn(
        registry: *mut OrtKernelRegistry,
        def: *const OrtKernelDef,
        create: OrtKernelCreateFunc,
        state: *mut c_void,
    ) -> OrtStatusPtr,
    pub CreateKernelDefBuilder:
        unsafe extern "system" fn(builder: *mut *mut OrtKernelDefBuilder) -> OrtStatusPtr,
    pub ReleaseKernelDefBuilder: unsafe extern "system" fn(builder: *mut OrtKernelDefBuilder),
    pub KernelDefBuilder_SetOperatorType: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        op_type: *const c_char,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_SetDomain: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        domain: *const c_char,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_SetSinceVersion: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        start: c_int,
        end: c_int,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_SetExecutionProvider: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        ep: *const c_char,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_SetInputMemType: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        index: usize,
        mem: OrtMemType,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_SetOutputMemType: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        index: usize,
        mem: OrtMemType,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_AddTypeConstraint: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        arg: *const c_char,
        types: *const *const OrtDataType,
        count: usize,
    ) -> OrtStatusPtr,
    pub KernelDefBuilder_AddInputOutputAliases: Unused,
    pub KernelDefBuilder_AddInputOutputMutableAliases: Unused,
    pub KernelDefBuilder_Build: unsafe extern "system" fn(
        builder: *mut OrtKernelDefBuilder,
        def: *mut *mut OrtKernelDef,
    ) -> OrtStatusPtr,
    pub ReleaseKernelDef: unsafe extern "system" fn(def: *mut OrtKernelDef),
    pub KernelDef_GetOperatorType:
        unsafe extern "system" fn(def: *const OrtKernelDef) -> *const c_char,
    pub KernelDef_GetDomain: Unused,
    pub KernelDef_GetSinceVersion: Unused,
    pub KernelDef_GetExecutionProvider: Unused,
    pub KernelDef_GetInputMemType: Unused,
    pub KernelDef_GetOutputMemType: Unused,
    pub GetTensorDataType: unsafe extern "system" fn(
        elem: ONNXTensorElementDataType,
        out: *mut *const OrtDataType,
    ) -> OrtStatusPtr,
    pub EpGraphSupportInfo_LookUpKernel: unsafe extern "system" fn(
        info: *mut OrtEpGraphSupportInfo,
        node: *const OrtNode,
        def: *mut *const OrtKernelDef,
    ) -> OrtStatusPtr,
    pub SharedPrePackedWeightCache_StoreWeightData: Unused,
    pub KernelInfo_GetEp: unsafe extern "system" fn(
        info: *const OrtKernelInfo,
        ep: *mut *const OrtEp,
    ) -> OrtStatusPtr,
}

/// The factory ONNX Runtime gets from `CreateEpFactories`: members up to 1.24.
#[repr(C)]
pub struct OrtEpFactory {
    pub ort_version_supported: u32,
    // 1.22
    pub GetName: Option<unsafe extern "system" fn(this: *const OrtEpFactory) -> *const c_char>,
    pub GetVendor: Option<unsafe extern "system" fn(this: *const OrtEpFactory) -> *const c_char>,
    pub GetSupportedDevices: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            num_devices: usize,
            ep_devices: *mut *mut OrtEpDevice,
            max_ep_devices: usize,
            num_ep_devices: *mut usize,
        ) -> OrtStatusPtr,
    >,
    pub CreateEp: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            ep_metadata: *const *const OrtKeyValuePairs,
            num_devices: usize,
            session_options: *const OrtSessionOptions,
            logger: *const OrtLogger,
            ep: *mut *mut OrtEp,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseEp: Option<unsafe extern "system" fn(this: *mut OrtEpFactory, ep: *mut OrtEp)>,
    // 1.23
    pub GetVendorId: Option<unsafe extern "system" fn(this: *const OrtEpFactory) -> u32>,
    pub GetVersion: Option<unsafe extern "system" fn(this: *const OrtEpFactory) -> *const c_char>,
    pub ValidateCompiledModelCompatibilityInfo: Option<Unusedfn>,
    pub CreateAllocator: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            memory_info: *const OrtMemoryInfo,
            options: *const OrtKeyValuePairs,
            allocator: *mut *mut OrtAllocator,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseAllocator:
        Option<unsafe extern "system" fn(this: *mut OrtEpFactory, allocator: *mut OrtAllocator)>,
    pub CreateDataTransfer: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            transfer: *mut *mut OrtDataTransferImpl,
        ) -> OrtStatusPtr,
    >,
    pub IsStreamAware: Option<unsafe extern "system" fn(this: *const OrtEpFactory) -> bool>,
    pub CreateSyncStreamForDevice: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            device: *const OrtMemoryDevice,
            options: *const OrtKeyValuePairs,
            stream: *mut *mut OrtSyncStreamImpl,
        ) -> OrtStatusPtr,
    >,
    // 1.24
    pub GetHardwareDeviceIncompatibilityDetails: Option<Unusedfn>,
    pub CreateExternalResourceImporterForDevice: Option<Unusedfn>,
    pub GetNumCustomOpDomains: Option<
        unsafe extern "system" fn(this: *mut OrtEpFactory, count: *mut usize) -> OrtStatusPtr,
    >,
    pub GetCustomOpDomains: Option<
        unsafe extern "system" fn(
            this: *mut OrtEpFactory,
            domains: *mut *mut OrtCustomOpDomain,
            count: usize,
        ) -> OrtStatusPtr,
    >,
}

/// A member this library leaves null (ONNX Runtime checks these for null).
pub type Unusedfn = unsafe extern "system" fn();

/// One execution-provider instance: members up to 1.24.
#[repr(C)]
pub struct OrtEp {
    pub ort_version_supported: u32,
    // 1.22
    pub GetName: Option<unsafe extern "system" fn(this: *const OrtEp) -> *const c_char>,
    // 1.23
    pub GetCapability: Option<
        unsafe extern "system" fn(
            this: *mut OrtEp,
            graph: *const OrtGraph,
            info: *mut OrtEpGraphSupportInfo,
        ) -> OrtStatusPtr,
    >,
    pub Compile: Option<Unusedfn>,
    pub ReleaseNodeComputeInfos: Option<Unusedfn>,
    pub GetPreferredDataLayout: Option<Unusedfn>,
    pub ShouldConvertDataLayoutForOp: Option<Unusedfn>,
    pub SetDynamicOptions: Option<Unusedfn>,
    pub OnRunStart: Option<
        unsafe extern "system" fn(this: *mut OrtEp, options: *const OrtRunOptions) -> OrtStatusPtr,
    >,
    pub OnRunEnd: Option<
        unsafe extern "system" fn(
            this: *mut OrtEp,
            options: *const OrtRunOptions,
            sync: bool,
        ) -> OrtStatusPtr,
    >,
    pub CreateAllocator: Option<Unusedfn>,
    pub CreateSyncStreamForDevice: Option<Unusedfn>,
    pub GetCompiledModelCompatibilityInfo: Option<Unusedfn>,
    // 1.24
    pub GetKernelRegistry: Option<
        unsafe extern "system" fn(
            this: *mut OrtEp,
            registry: *mut *const OrtKernelRegistry,
        ) -> OrtStatusPtr,
    >,
    pub IsConcurrentRunSupported:
        Option<unsafe extern "system" fn(this: *mut OrtEp, supported: *mut bool) -> OrtStatusPtr>,
}

/// One kernel instance of a kernel-registry EP (1.24).
#[repr(C)]
pub struct OrtKernelImpl {
    pub ort_version_supported: u32,
    /// Must be 0 (used internally by ONNX Runtime).
    pub flags: u32,
    pub Compute: Option<
        unsafe extern "system" fn(
            this: *mut OrtKernelImpl,
            ctx: *mut OrtKernelContext,
        ) -> OrtStatusPtr,
    >,
    pub Release: Option<unsafe extern "system" fn(this: *mut OrtKernelImpl)>,
    pub PrePackWeight: Option<Unusedfn>,
    pub SetSharedPrePackedWeight: Option<Unusedfn>,
}

/// Copies between the EP's device memory and CPU memory (1.23).
#[repr(C)]
pub struct OrtDataTransferImpl {
    pub ort_version_supported: u32,
    pub Release: Option<unsafe extern "system" fn(this: *mut OrtDataTransferImpl)>,
    pub CanCopy: Option<
        unsafe extern "system" fn(
            this: *const OrtDataTransferImpl,
            src: *const OrtMemoryDevice,
            dst: *const OrtMemoryDevice,
        ) -> bool,
    >,
    pub CopyTensors: Option<
        unsafe extern "system" fn(
            this: *mut OrtDataTransferImpl,
            src: *const *const OrtValue,
            dst: *const *mut OrtValue,
            streams: *const *mut OrtSyncStream,
            count: usize,
        ) -> OrtStatusPtr,
    >,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    const P: usize = size_of::<usize>();

    /// Member `i` (0-based) of a table that starts with a `uint32_t` version: the version
    /// is padded to pointer alignment, each member is one pointer.
    fn slot(i: usize) -> usize {
        P + i * P
    }

    #[test]
    fn ep_api_members_are_in_header_order() {
        assert_eq!(offset_of!(OrtEpApi, CreateEpDevice), 0);
        assert_eq!(offset_of!(OrtEpApi, EpGraphSupportInfo_AddSingleNode), 3 * P);
        assert_eq!(offset_of!(OrtEpApi, EpDevice_AddAllocatorInfo), 5 * P);
        assert_eq!(offset_of!(OrtEpApi, MemoryInfo_GetMemoryDevice), 6 * P);
        assert_eq!(offset_of!(OrtEpApi, Value_GetMemoryDevice), 7 * P);
        assert_eq!(offset_of!(OrtEpApi, MemoryDevice_AreEqual), 8 * P);
        assert_eq!(offset_of!(OrtEpApi, MemoryDevice_GetDeviceId), 12 * P);
        assert_eq!(offset_of!(OrtEpApi, CreateHardwareDevice), 16 * P);
        assert_eq!(offset_of!(OrtEpApi, ReleaseHardwareDevice), 17 * P);
        assert_eq!(offset_of!(OrtEpApi, CreateKernelRegistry), 18 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelRegistry_AddKernel), 20 * P);
        assert_eq!(offset_of!(OrtEpApi, CreateKernelDefBuilder), 21 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelDefBuilder_SetOperatorType), 23 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelDefBuilder_SetInputMemType), 27 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelDefBuilder_AddTypeConstraint), 29 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelDefBuilder_Build), 32 * P);
        assert_eq!(offset_of!(OrtEpApi, ReleaseKernelDef), 33 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelDef_GetOperatorType), 34 * P);
        assert_eq!(offset_of!(OrtEpApi, GetTensorDataType), 40 * P);
        assert_eq!(offset_of!(OrtEpApi, EpGraphSupportInfo_LookUpKernel), 41 * P);
        assert_eq!(offset_of!(OrtEpApi, KernelInfo_GetEp), 43 * P);
        assert_eq!(size_of::<OrtEpApi>(), 44 * P);
    }

    #[test]
    fn factory_members_are_in_header_order() {
        assert_eq!(offset_of!(OrtEpFactory, GetName), slot(0));
        assert_eq!(offset_of!(OrtEpFactory, GetSupportedDevices), slot(2));
        assert_eq!(offset_of!(OrtEpFactory, ReleaseEp), slot(4));
        assert_eq!(offset_of!(OrtEpFactory, GetVendorId), slot(5));
        assert_eq!(offset_of!(OrtEpFactory, CreateAllocator), slot(8));
        assert_eq!(offset_of!(OrtEpFactory, CreateDataTransfer), slot(10));
        assert_eq!(offset_of!(OrtEpFactory, CreateSyncStreamForDevice), slot(12));
        assert_eq!(offset_of!(OrtEpFactory, GetNumCustomOpDomains), slot(15));
        assert_eq!(offset_of!(OrtEpFactory, GetCustomOpDomains), slot(16));
        assert_eq!(size_of::<OrtEpFactory>(), slot(17));
    }

    #[test]
    fn ep_members_are_in_header_order() {
        assert_eq!(offset_of!(OrtEp, GetName), slot(0));
        assert_eq!(offset_of!(OrtEp, GetCapability), slot(1));
        assert_eq!(offset_of!(OrtEp, OnRunStart), slot(7));
        assert_eq!(offset_of!(OrtEp, OnRunEnd), slot(8));
        assert_eq!(offset_of!(OrtEp, GetKernelRegistry), slot(12));
        assert_eq!(offset_of!(OrtEp, IsConcurrentRunSupported), slot(13));
        assert_eq!(size_of::<OrtEp>(), slot(14));
    }

    #[test]
    fn kernel_impl_has_the_1_24_flags_member() {
        assert_eq!(offset_of!(OrtKernelImpl, flags), 4);
        assert_eq!(offset_of!(OrtKernelImpl, Compute), 8);
        assert_eq!(offset_of!(OrtKernelImpl, Release), 8 + P);
        assert_eq!(size_of::<OrtKernelImpl>(), 8 + 4 * P);
    }

    #[test]
    fn data_transfer_members_are_in_header_order() {
        assert_eq!(offset_of!(OrtDataTransferImpl, Release), slot(0));
        assert_eq!(offset_of!(OrtDataTransferImpl, CanCopy), slot(1));
        assert_eq!(offset_of!(OrtDataTransferImpl, CopyTensors), slot(2));
        assert_eq!(size_of::<OrtDataTransferImpl>(), slot(3));
    }

    #[test]
    fn enums_have_the_header_values() {
        assert_eq!(OrtHardwareDeviceType::OrtHardwareDeviceType_NPU as i32, 2);
        assert_eq!(OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_NPU as i32, 3);
        assert_eq!(OrtDeviceMemoryType::OrtDeviceMemoryType_DEFAULT as i32, 0);
    }
}

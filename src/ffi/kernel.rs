//! One node's kernel inside ONNX Runtime, for the custom-op domain and the EP alike: the
//! kernel info it is created from, the kernel context it computes with (inputs, outputs,
//! the session's intra-op thread pool) and the tensors (`OrtValue`) both hand out. Where the
//! memory lives (host for the custom ops, the card for the EP) is the caller's business:
//! these wrappers only share the ORT calls.

use super::attributes::Attributes;
use super::ep_abi::{OrtEp, OrtMemoryDevice};
use super::{Handle, api, check, checked, ep_api, read_string};
use crate::error::{Error, Result};
use crate::parallel::Parallel;
use crate::tensor::{
    CardTensor, DType, Data, Inputs, OutData, OutputHost, OutputSpec, Outputs, TensorRef,
};
use ort_sys::{ONNXTensorElementDataType as Ty, OrtKernelContext, OrtKernelInfo, OrtValue};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

pub fn dtype_of(t: Ty) -> Option<DType> {
    Some(match t {
        Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => DType::F32,
        Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => DType::F16,
        Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => DType::I32,
        Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => DType::I64,
        _ => return None,
    })
}

pub fn onnx_type(d: DType) -> Ty {
    match d {
        DType::F32 => Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        DType::F16 => Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
        DType::I32 => Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
        DType::I64 => Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
    }
}

/// Builds a typed slice over tensor memory owned by ONNX Runtime.
///
/// # Safety
/// `ptr` must point to `len` initialised elements of `T` (or `len` must be 0) that stay
/// valid and unmodified for `'a`.
unsafe fn slice<'a, T>(ptr: *const c_void, len: usize) -> &'a [T] {
    if len == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: caller contract.
        unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
    }
}

/// # Safety
/// As [`slice`], and no other reference to the memory may be live for `'a`.
unsafe fn slice_mut<'a, T>(ptr: *mut c_void, len: usize) -> &'a mut [T] {
    if len == 0 || ptr.is_null() {
        &mut []
    } else {
        // SAFETY: caller contract.
        unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) }
    }
}

/// The kernel info ONNX Runtime passes when it creates a kernel (custom op or EP kernel).
pub type KernelInfo<'a> = Handle<'a, OrtKernelInfo>;
/// A tensor handed out by ONNX Runtime (a kernel's input or output, or a data-transfer
/// operand).
pub type Value<'a> = Handle<'a, OrtValue>;
/// The kernel context of one compute call.
pub type KernelContext<'a> = Handle<'a, OrtKernelContext>;

impl<'a> KernelInfo<'a> {
    /// The node's name (empty when ONNX Runtime has none for it).
    pub fn node_name(self) -> String {
        read_string(|buf, size| {
            // SAFETY: the info is live (Handle::from_raw's contract); `buf` is null or holds `*size` bytes.
            unsafe { (api().KernelInfo_GetNodeName)(self.ptr, buf, size) }
        })
        .unwrap_or_default()
    }

    /// The node's attributes.
    pub fn attributes(self) -> Attributes<'a> {
        Attributes::Kernel(self)
    }

    /// The EP instance the kernel is created for (EP kernels only).
    pub fn ep(self) -> Result<*const OrtEp> {
        let mut ep: *const OrtEp = std::ptr::null();
        // SAFETY: the info is live; `ep` is a valid out pointer.
        checked("KernelInfo_GetEp", unsafe { (ep_api().KernelInfo_GetEp)(self.ptr, &mut ep) })?;
        if ep.is_null() {
            return Err(Error::Runtime("KernelInfo_GetEp returned no EP".into()));
        }
        Ok(ep)
    }
}

impl<'a> Value<'a> {
    /// The element type and the shape (which ONNX Runtime keeps as long as the value).
    pub fn type_and_shape(self) -> Result<(Ty, &'a [i64])> {
        let (mut ty, mut dims, mut rank) =
            (Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, std::ptr::null(), 0usize);
        // SAFETY: the value is live (Handle::from_raw's contract); valid out pointers.
        checked("GetTensorElementTypeAndShapeDataReference", unsafe {
            (api().GetTensorElementTypeAndShapeDataReference)(
                self.ptr, &mut ty, &mut dims, &mut rank,
            )
        })?;
        // SAFETY: ORT returned `rank` dims at `dims`, valid while the value is.
        Ok((ty, unsafe { slice::<i64>(dims.cast(), rank) }))
    }

    /// The buffer's address (host or card memory, wherever the value lives).
    pub fn data(self) -> Result<*mut c_void> {
        let mut data = std::ptr::null_mut();
        // SAFETY: the value is live; GetTensorMutableData only returns its buffer (inputs are
        // never written through it).
        checked("GetTensorMutableData", unsafe {
            (api().GetTensorMutableData)(self.ptr, &mut data)
        })?;
        Ok(data)
    }

    pub fn size_in_bytes(self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: the value is live; valid out pointer.
        checked("GetTensorSizeInBytes", unsafe {
            (api().GetTensorSizeInBytes)(self.ptr, &mut bytes)
        })?;
        Ok(bytes)
    }

    /// The memory device the value lives on (null for plain host memory).
    pub fn memory_device(self) -> *const OrtMemoryDevice {
        // SAFETY: the value is live.
        unsafe { (ep_api().Value_GetMemoryDevice)(self.ptr) }
    }
}

impl<'a> KernelContext<'a> {
    pub fn input_count(self) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: the context is live (Handle::from_raw's contract); valid out pointer.
        checked("KernelContext_GetInputCount", unsafe {
            (api().KernelContext_GetInputCount)(self.ptr, &mut count)
        })?;
        Ok(count)
    }

    /// Input `i` (`None` for an absent optional input).
    pub fn input(self, i: usize) -> Result<Option<Value<'a>>> {
        let mut value: *const OrtValue = std::ptr::null();
        // SAFETY: the context is live; `value` is a valid out pointer.
        checked("KernelContext_GetInput", unsafe {
            (api().KernelContext_GetInput)(self.ptr, i, &mut value)
        })?;
        // SAFETY: a non-null input is a live tensor of this compute call.
        Ok((!value.is_null()).then(|| unsafe { Value::from_raw(value) }))
    }

    /// The first `n` inputs (the schema's count) with shape, element type and address;
    /// inputs past the node's own are absent optionals.
    pub fn tensors(self, n: usize) -> Result<Vec<Option<CardTensor>>> {
        let count = self.input_count()?;
        let mut tensors = Vec::with_capacity(n);
        for i in 0..n {
            let value = if i < count { self.input(i)? } else { None };
            tensors.push(match value {
                None => None,
                Some(v) => {
                    let (ty, shape) = v.type_and_shape()?;
                    let dtype = dtype_of(ty).ok_or_else(|| {
                        Error::Runtime(format!("input {i} has unsupported element type {ty:?}"))
                    })?;
                    Some(CardTensor { shape: shape.to_vec(), dtype, data: v.data()? })
                }
            });
        }
        Ok(tensors)
    }

    /// Output `i` with the given shape, allocated by ONNX Runtime on the side the kernel
    /// definition declares.
    pub fn output(self, i: usize, shape: &[i64]) -> Result<Value<'a>> {
        let mut value: *mut OrtValue = std::ptr::null_mut();
        // SAFETY: the context is live; `shape` has shape.len() values.
        checked("KernelContext_GetOutput", unsafe {
            (api().KernelContext_GetOutput)(self.ptr, i, shape.as_ptr(), shape.len(), &mut value)
        })?;
        if value.is_null() {
            return Err(Error::Runtime(format!("KernelContext_GetOutput returned no output {i}")));
        }
        // SAFETY: the output just allocated lives for the compute call.
        Ok(unsafe { Value::from_raw(value) })
    }

    /// Allocates output `i` for `spec` and returns its buffer (null only when it holds no
    /// element). `name` names the output and `memory` its allocator (host or card) in the
    /// error for an output ONNX Runtime handed back without memory: the allocators log their
    /// own failures, but no logger may be installed, so the message says it.
    pub fn allocate(
        self,
        i: usize,
        spec: &OutputSpec,
        name: &str,
        memory: &str,
    ) -> Result<*mut c_void> {
        let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
        let mut value: *mut OrtValue = std::ptr::null_mut();
        // SAFETY: the context is live; dims has dims.len() values.
        checked("KernelContext_GetOutput", unsafe {
            (api().KernelContext_GetOutput)(self.ptr, i, dims.as_ptr(), dims.len(), &mut value)
        })?;
        // SAFETY: a non-null output is the tensor just allocated for this compute call.
        let data = if value.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { Value::from_raw(value) }.data()?
        };
        if spec.numel() > 0 && data.is_null() {
            let bytes = spec.numel().saturating_mul(spec.dtype.size());
            return Err(Error::Runtime(format!(
                "output '{name}': onnxruntime could not allocate it ({:?} {:?}, {:.1} MB): out of {memory} memory",
                spec.dtype,
                spec.shape,
                bytes as f64 / 1e6
            )));
        }
        Ok(data)
    }

    /// All inputs, named after the schema, as views of host memory (the custom ops' inputs).
    pub fn host_inputs(self, names: Vec<String>) -> Result<Inputs<'a>> {
        let mut views = Vec::with_capacity(names.len());
        for (i, t) in self.tensors(names.len())?.into_iter().enumerate() {
            views.push(match t {
                None => None,
                Some(CardTensor { shape, dtype, data }) => {
                    let numel = shape
                        .iter()
                        .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?));
                    let n = numel.ok_or_else(|| {
                        Error::Runtime(format!("input {i} has an invalid shape {shape:?}"))
                    })?;
                    // SAFETY: a host tensor holding `n` elements of the reported type, alive for
                    // the compute call ('a).
                    let data = unsafe {
                        match dtype {
                            DType::F32 => Data::F32(slice(data, n)),
                            DType::F16 => Data::F16(slice(data, n)),
                            DType::I32 => Data::I32(slice(data, n)),
                            DType::I64 => Data::I64(slice(data, n)),
                        }
                    };
                    Some(TensorRef { shape, data })
                }
            });
        }
        Inputs::new(names, views)
    }

    /// The session's intra-op thread pool.
    pub fn pool(self) -> OrtPool {
        OrtPool { ctx: self.ptr }
    }
}

/// Outputs allocated in host memory through the kernel context (the custom ops' outputs).
pub struct ContextOutputs<'a> {
    pub ctx: KernelContext<'a>,
    pub names: Vec<String>,
}

impl OutputHost for ContextOutputs<'_> {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        let mut bufs = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let name = self.names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
            let data = self.ctx.allocate(i, spec, &name, "host")?;
            let n = spec.numel();
            // SAFETY: ORT allocated `n` elements of the kernel-def type (= spec.dtype, which
            // the registration derived from the same schema) exclusively for this output,
            // valid for the compute call that borrows `self`.
            bufs.push(unsafe {
                match spec.dtype {
                    DType::F32 => OutData::F32(slice_mut(data, n)),
                    DType::F16 => OutData::F16(slice_mut(data, n)),
                    DType::I32 => OutData::I32(slice_mut(data, n)),
                    DType::I64 => OutData::I64(slice_mut(data, n)),
                }
            });
        }
        Ok(Outputs::new(self.names.clone(), bufs))
    }
}

/// The session's intra-op thread pool, through `KernelContext_ParallelFor`.
pub struct OrtPool {
    ctx: *const OrtKernelContext,
}

// SAFETY: the context pointer is only used to call KernelContext_ParallelFor from the thread
// running compute; ORT's pool then calls our trampoline from its worker threads.
unsafe impl Sync for OrtPool {}

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    panicked: AtomicBool,
}

unsafe extern "C" fn trampoline(data: *mut c_void, i: usize) {
    // SAFETY: `data` is the `Job` that `run` passed, alive until ParallelFor returns.
    let job = unsafe { &*(data as *const Job<'_>) };
    if job.panicked.load(Ordering::Relaxed) {
        return;
    }
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(i))).is_err() {
        job.panicked.store(true, Ordering::Relaxed);
    }
}

impl Parallel for OrtPool {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 {
            return (0..tasks).for_each(f);
        }
        let job = Job { f, panicked: AtomicBool::new(false) };
        // SAFETY: ctx is the live context; `job` outlives the call, which returns only when
        // every iteration has run.
        let s = unsafe {
            (api().KernelContext_ParallelFor)(
                self.ctx,
                trampoline,
                tasks,
                0,
                &job as *const Job<'_> as *mut c_void,
            )
        };
        if let Err(m) = check(s) {
            // The pool refused the work before running it: run it here rather than lose it.
            log::warn!("KernelContext_ParallelFor failed ({m}); running {tasks} tasks serially");
            return (0..tasks).for_each(f);
        }
        if job.panicked.load(Ordering::Relaxed) {
            // Re-raised on the compute thread, where the boundary guard turns it into a status.
            std::panic::panic_any(String::from("a parallel task panicked"));
        }
    }
}

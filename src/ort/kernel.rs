//! One node's kernel inside ONNX Runtime: reads the inputs from the `OrtKernelContext`,
//! allocates outputs through it, and runs work on the session's intra-op thread pool.

use super::{api, check};
use crate::error::{Error, Result};
use crate::ops::OutputHost;
use crate::parallel::Parallel;
use crate::tensor::{Data, DType, Inputs, OutData, OutputSpec, Outputs, TensorRef};
use ort_sys::{ONNXTensorElementDataType as Ty, OrtKernelContext, OrtValue};
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

fn runtime(what: &str, msg: String) -> Error {
    Error::Runtime(format!("{what}: {msg}"))
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

/// Reads input `i` of the context (`None` for an absent optional input).
///
/// # Safety
/// `ctx` must be the live kernel context of the current compute call.
unsafe fn input<'a>(ctx: *const OrtKernelContext, i: usize) -> Result<Option<TensorRef<'a>>> {
    let api = api();
    let mut value: *const OrtValue = std::ptr::null();
    // SAFETY: ctx is live (caller contract); `value` is a valid out pointer.
    check(unsafe { (api.KernelContext_GetInput)(ctx, i, &mut value) }).map_err(|m| runtime("KernelContext_GetInput", m))?;
    if value.is_null() {
        return Ok(None);
    }
    let mut ty = Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    let mut dims: *const i64 = std::ptr::null();
    let mut rank = 0usize;
    // SAFETY: value is a live tensor of this context; the out pointers are valid. The shape
    // data reference stays valid while the value does (the whole compute call).
    check(unsafe { (api.GetTensorElementTypeAndShapeDataReference)(value, &mut ty, &mut dims, &mut rank) })
        .map_err(|m| runtime("GetTensorElementTypeAndShapeDataReference", m))?;
    // SAFETY: ORT returned `rank` dims at `dims`.
    let shape: Vec<i64> = unsafe { slice::<i64>(dims.cast(), rank) }.to_vec();
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?));
    let numel = numel.ok_or_else(|| Error::Runtime(format!("input {i} has an invalid shape {shape:?}")))?;
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: value is a live tensor; GetTensorMutableData only returns its buffer (we never
    // write through it).
    check(unsafe { (api.GetTensorMutableData)(value.cast_mut(), &mut data) })
        .map_err(|m| runtime("GetTensorMutableData", m))?;
    let dtype = dtype_of(ty).ok_or_else(|| Error::Runtime(format!("input {i} has unsupported element type {ty:?}")))?;
    // SAFETY: the buffer holds `numel` elements of the reported type and lives for the call.
    let data = unsafe {
        match dtype {
            DType::F32 => Data::F32(slice(data, numel)),
            DType::F16 => Data::F16(slice(data, numel)),
            DType::I32 => Data::I32(slice(data, numel)),
            DType::I64 => Data::I64(slice(data, numel)),
        }
    };
    Ok(Some(TensorRef { shape, data }))
}

/// All inputs of the context, named after the schema.
///
/// # Safety
/// `ctx` must be the live kernel context of the current compute call; the returned views
/// must not outlive it.
pub unsafe fn inputs<'a>(ctx: *const OrtKernelContext, names: Vec<String>) -> Result<Inputs<'a>> {
    let mut count = 0usize;
    // SAFETY: ctx is live.
    check(unsafe { (api().KernelContext_GetInputCount)(ctx, &mut count) })
        .map_err(|m| runtime("KernelContext_GetInputCount", m))?;
    let mut tensors = Vec::with_capacity(names.len());
    for i in 0..names.len() {
        // SAFETY: ctx is live; indices beyond the node's input count are absent optionals.
        tensors.push(if i < count { unsafe { input(ctx, i)? } } else { None });
    }
    Inputs::new(names, tensors)
}

/// Why an output that onnxruntime handed back without memory failed: the allocator of
/// `memory` (host or card) had none for it. The allocators log their own failures, but
/// no logger may be installed, so the message says it.
pub fn not_allocated(spec: &OutputSpec, memory: &str) -> String {
    let bytes = spec.numel().saturating_mul(spec.dtype.size());
    format!(
        "onnxruntime could not allocate it ({:?} {:?}, {:.1} MB): out of {memory} memory",
        spec.dtype,
        spec.shape,
        bytes as f64 / 1e6
    )
}

/// Allocates outputs through the kernel context.
pub struct ContextOutputs {
    pub ctx: *mut OrtKernelContext,
    pub names: Vec<String>,
}

impl OutputHost for ContextOutputs {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        let api = api();
        let mut bufs = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            let mut value: *mut OrtValue = std::ptr::null_mut();
            // SAFETY: ctx is the live context of this compute call; dims has dims.len() values.
            check(unsafe { (api.KernelContext_GetOutput)(self.ctx, i, dims.as_ptr(), dims.len(), &mut value) })
                .map_err(|m| runtime("KernelContext_GetOutput", m))?;
            let mut data: *mut c_void = std::ptr::null_mut();
            if !value.is_null() {
                // SAFETY: value is the output tensor just allocated.
                check(unsafe { (api.GetTensorMutableData)(value, &mut data) })
                    .map_err(|m| runtime("GetTensorMutableData", m))?;
            }
            let n = spec.numel();
            if n > 0 && data.is_null() {
                let name = self.names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
                return Err(Error::Runtime(format!("output '{name}': {}", not_allocated(spec, "host"))));
            }
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
    pub ctx: *const OrtKernelContext,
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
            (api().KernelContext_ParallelFor)(self.ctx, trampoline, tasks, 0, &job as *const Job<'_> as *mut c_void)
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

//! The emulated MLU-OPS library: a stand-in for Cambricon's `libmluops.so` on the emulated
//! card, so that the provider's MLU-OPS backend (src/mluops, ops/<family>/mluops.rs) runs end
//! to end in the tests: version check, handles, descriptors, workspace queries, calls,
//! num_act_out, statuses, declines. It exports the C functions the binding calls, each
//! asserted at compile time to have the binding's type (`mluops::exports`, from the
//! `functions!` table of src/mluops/mod.rs), and enforces each function's documented
//! parameter rules (MLUOP_STATUS_BAD_PARAM for descriptor mismatches,
//! MLUOP_STATUS_NOT_SUPPORTED past a scale limitation) as docs/MLUOPS_BINDING.md states them.
//!
//! What it computes with: this crate's CPU kernels, on the emulated card's memory (host
//! memory), for every function. It stands in for the vendor's kernels; it is not our BANG
//! backend (which has its own tests), so a result of the MLU-OPS backend here is the CPU
//! kernel's. What it cannot model: the vendor kernels' own arithmetic and summation order,
//! asynchrony (each call computes before returning, so a missing queue synchronisation
//! after a call goes unseen here), and whether a pointer lies inside a card allocation.
//! Where the vendor library's behaviour is undefined (index values out of range, which it
//! does not check) this one fails the call with MLUOP_STATUS_EXECUTION_FAILED, so a
//! missing value check in the provider shows up as an error rather than a result.
//!
//! `MLUOPS_EMULATED_VERSION=major.minor.patch` changes the version it reports (1.4.0 by
//! default), for the tests of the provider's version check.

// Each exported function's safety contract is the C header's (valid pointers of the sizes
// its descriptors state): docs/MLUOPS_BINDING.md §1-§2, not repeated per function.
#![allow(clippy::missing_safety_doc)]

use onnxruntime_ep_mlu::ops::{self, Operator};
use onnxruntime_ep_mlu::parallel::Serial;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::{OwnedData, Tensor};
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

// The statuses, enums and signatures are the binding's (src/mluops/mod.rs), which
// tests/mluops_header.rs checks against the header: this library models the vendor's
// behaviour, not its declarations. Its exports take an enum as C passes it, an `int`, so
// that a value the binding does not know is rejected (BAD_PARAM) rather than undefined.
use onnxruntime_ep_mlu::mluops::{
    self, BAD_PARAM, DType, EXECUTION_FAILED, INTERNAL_ERROR, Layout, NOT_SUPPORTED, ReduceMode,
    SUCCESS, Status, exports, status_name,
};

const DTYPE_HALF: c_int = DType::Half as c_int;
const DTYPE_FLOAT: c_int = DType::Float as c_int;
const DTYPE_INT32: c_int = DType::Int32 as c_int;
/// `MLUOP_DTYPE_INT64` (mlu_op.h v1.4.0:170-178): accepted in descriptors as the vendor's
/// library does, though the binding's `DType` has no use for it.
const DTYPE_INT64: c_int = 9;
const LAYOUT_NHWC: c_int = Layout::Nhwc as c_int;
const LAYOUT_ARRAY: c_int = Layout::Array as c_int;
const REDUCE_MAX: c_int = ReduceMode::Max as c_int;

/// Why the last call of this thread failed, printed to stderr as the vendor library logs.
fn fail(status: Status, why: &str) -> Status {
    eprintln!("[emulated MLU-OPS] {}: {why}", status_name(status));
    status
}

/// Runs an exported function's body; a panic becomes MLUOP_STATUS_INTERNAL_ERROR.
fn guarded(name: &str, f: impl FnOnce() -> Result<(), Status>) -> Status {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(s)) => s,
        Err(_) => fail(INTERNAL_ERROR, &format!("{name} panicked")),
    }
}

/// `Err(status)` with a message when `cond` is false.
fn require(cond: bool, status: Status, why: impl FnOnce() -> String) -> Result<(), Status> {
    if cond { Ok(()) } else { Err(fail(status, &why())) }
}

struct Context {
    queue: *mut c_void,
    /// A handle must not be used by two threads at once: a call that finds it busy fails.
    busy: AtomicBool,
}

struct TensorDesc {
    layout: c_int,
    dtype: c_int,
    dims: Vec<usize>,
}

impl TensorDesc {
    fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

#[derive(Default)]
struct SparseConv {
    set: bool,
    batch: i32,
    pad: [i32; 3],
    stride: [i32; 3],
    dilation: [i32; 3],
    input: [i32; 3],
    filter: [i32; 3],
    output: [i32; 3],
    sub_m: i32,
    num_act_out: i32,
}

/// The handle, with its busy flag set until the returned guard drops.
struct InUse<'a>(&'a Context);

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

fn handle<'a>(h: *mut c_void) -> Result<InUse<'a>, Status> {
    require(!h.is_null(), BAD_PARAM, || "handle is null".into())?;
    // SAFETY: a handle made by mluOpCreate (the caller's contract, as with the vendor's).
    let ctx = unsafe { &*(h as *const Context) };
    require(!ctx.queue.is_null(), BAD_PARAM, || {
        "no queue set on the handle (mluOpSetQueue)".into()
    })?;
    require(!ctx.busy.swap(true, Ordering::AcqRel), EXECUTION_FAILED, || {
        "the handle is in use by another thread".into()
    })?;
    Ok(InUse(ctx))
}

fn desc<'a>(d: *mut c_void, what: &str) -> Result<&'a TensorDesc, Status> {
    require(!d.is_null(), BAD_PARAM, || format!("{what}: descriptor is null"))?;
    // SAFETY: a descriptor made by mluOpCreateTensorDescriptor.
    let d = unsafe { &*(d as *const TensorDesc) };
    require(!d.dims.is_empty(), BAD_PARAM, || format!("{what}: descriptor was never set"))?;
    // core/logging.h: tensors of 2^31 elements or more are not supported.
    require(d.numel() < 1 << 31, NOT_SUPPORTED, || {
        format!("{what}: {} elements (2^31 or more)", d.numel())
    })?;
    Ok(d)
}

fn expect(d: &TensorDesc, what: &str, dtype: c_int, dims: &[usize]) -> Result<(), Status> {
    require(d.dtype == dtype, BAD_PARAM, || {
        format!("{what}: dtype {} where {dtype} is required", d.dtype)
    })?;
    require(d.dims == dims, BAD_PARAM, || {
        format!("{what}: dims {:?} where {dims:?} are required", d.dims)
    })
}

fn read<T: Copy>(p: *const c_void, n: usize, what: &str) -> Result<Vec<T>, Status> {
    if n == 0 {
        return Ok(Vec::new());
    }
    require(!p.is_null(), BAD_PARAM, || format!("{what}: null pointer"))?;
    // SAFETY: the caller passes card memory of the descriptor's size (the emulated card's
    // memory is host memory).
    Ok(unsafe { std::slice::from_raw_parts(p as *const T, n) }.to_vec())
}

fn write<T: Copy>(p: *mut c_void, data: &[T], what: &str) -> Result<(), Status> {
    if data.is_empty() {
        return Ok(());
    }
    require(!p.is_null(), BAD_PARAM, || format!("{what}: null pointer"))?;
    // SAFETY: as in `read`, for the output's descriptor size.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut T, data.len()) };
    Ok(())
}

fn tensor(d: &TensorDesc, p: *const c_void, what: &str) -> Result<Tensor, Status> {
    let n = d.numel();
    let data = match d.dtype {
        DTYPE_FLOAT => OwnedData::F32(read(p, n, what)?),
        DTYPE_HALF => OwnedData::F16(read(p, n, what)?),
        DTYPE_INT32 => OwnedData::I32(read(p, n, what)?),
        DTYPE_INT64 => OwnedData::I64(read(p, n, what)?),
        other => return Err(fail(BAD_PARAM, &format!("{what}: dtype {other} not supported"))),
    };
    Ok(Tensor { shape: d.dims.clone(), data })
}

fn store(t: &Tensor, p: *mut c_void, what: &str) -> Result<(), Status> {
    match &t.data {
        OwnedData::F32(v) => write(p, v, what),
        OwnedData::F16(v) => write(p, v, what),
        OwnedData::I32(v) => write(p, v, what),
        OwnedData::I64(v) => write(p, v, what),
    }
}

/// Runs the crate's CPU kernel of `O`. A contract error here is input the vendor library
/// does not check (index values): undefined there, a failed call here.
fn compute<O: Operator>(
    attrs: HashMap<String, AttrValue>,
    inputs: &[Option<&Tensor>],
) -> Result<Vec<Tensor>, Status> {
    let op =
        ops::descriptor::<O>(&attrs).map_err(|e| fail(BAD_PARAM, &format!("{}: {e}", O::NAME)))?;
    ops::run(&op, inputs, &Serial).map_err(|e| {
        fail(
            EXECUTION_FAILED,
            &format!(
                "{}: input the library does not check and whose result is undefined: {e}",
                O::NAME
            ),
        )
    })
}

fn ints(v: &[i32]) -> AttrValue {
    AttrValue::Ints(v.iter().map(|&x| i64::from(x)).collect())
}

fn attrs(pairs: Vec<(&str, AttrValue)>) -> HashMap<String, AttrValue> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

// ---- version, handles, descriptors ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetLibVersion(
    major: *mut c_int,
    minor: *mut c_int,
    patch: *mut c_int,
) {
    let v = std::env::var("MLUOPS_EMULATED_VERSION").unwrap_or_else(|_| "1.4.0".into());
    let mut parts = v.split('.').map(|p| p.parse::<c_int>().unwrap_or(0));
    for out in [major, minor, patch] {
        let value = parts.next().unwrap_or(0);
        if !out.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *out = value };
        }
    }
}
const _: exports::mluOpGetLibVersion = mluOpGetLibVersion;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetErrorString(s: Status) -> *const c_char {
    static NAMES: OnceLock<Vec<(Status, CString)>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let c = |name: &str| CString::new(name).expect("a C name has no NUL");
        mluops::STATUS.values.iter().map(|&(name, v)| (v, c(name))).collect()
    });
    names.iter().find(|(v, _)| *v == s).map_or(c"MLUOP_STATUS_UNKNOWN".as_ptr(), |n| n.1.as_ptr())
}
const _: exports::mluOpGetErrorString = mluOpGetErrorString;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpCreate(h: *mut *mut c_void) -> Status {
    guarded("mluOpCreate", || {
        require(!h.is_null(), BAD_PARAM, || "handle out-pointer is null".into())?;
        let ctx = Box::new(Context { queue: std::ptr::null_mut(), busy: AtomicBool::new(false) });
        // SAFETY: the caller's out-pointer.
        unsafe { *h = Box::into_raw(ctx).cast() };
        Ok(())
    })
}
const _: exports::mluOpCreate = mluOpCreate;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpDestroy(h: *mut c_void) -> Status {
    guarded("mluOpDestroy", || {
        require(!h.is_null(), BAD_PARAM, || "handle is null".into())?;
        // SAFETY: made by mluOpCreate, destroyed once (the caller's contract).
        drop(unsafe { Box::from_raw(h as *mut Context) });
        Ok(())
    })
}
const _: exports::mluOpDestroy = mluOpDestroy;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpSetQueue(h: *mut c_void, queue: *mut c_void) -> Status {
    guarded("mluOpSetQueue", || {
        require(!h.is_null(), BAD_PARAM, || "handle is null".into())?;
        // SAFETY: made by mluOpCreate; only the caller's thread uses it now.
        unsafe { (*(h as *mut Context)).queue = queue };
        Ok(())
    })
}
const _: exports::mluOpSetQueue = mluOpSetQueue;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpCreateTensorDescriptor(d: *mut *mut c_void) -> Status {
    guarded("mluOpCreateTensorDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor out-pointer is null".into())?;
        let desc = Box::new(TensorDesc { layout: LAYOUT_ARRAY, dtype: 0, dims: Vec::new() });
        // SAFETY: the caller's out-pointer.
        unsafe { *d = Box::into_raw(desc).cast() };
        Ok(())
    })
}
const _: exports::mluOpCreateTensorDescriptor = mluOpCreateTensorDescriptor;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpSetTensorDescriptor(
    d: *mut c_void,
    layout: c_int,
    dtype: c_int,
    dim_nb: c_int,
    dims: *const c_int,
) -> Status {
    guarded("mluOpSetTensorDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor is null".into())?;
        require(dim_nb > 0 && !dims.is_null(), BAD_PARAM, || {
            format!("dimNb {dim_nb} or null dims")
        })?;
        require((0..=10).contains(&layout), BAD_PARAM, || format!("layout {layout}"))?;
        require(
            matches!(dtype, DTYPE_HALF | DTYPE_FLOAT | DTYPE_INT32 | DTYPE_INT64),
            BAD_PARAM,
            || format!("dtype {dtype}"),
        )?;
        // SAFETY: `dims` holds dim_nb ints (the caller's contract).
        let dims = unsafe { std::slice::from_raw_parts(dims, dim_nb as usize) };
        require(dims.iter().all(|&x| x >= 0), BAD_PARAM, || {
            format!("negative dimension in {dims:?}")
        })?;
        // SAFETY: made by mluOpCreateTensorDescriptor.
        let desc = unsafe { &mut *(d as *mut TensorDesc) };
        *desc = TensorDesc { layout, dtype, dims: dims.iter().map(|&x| x as usize).collect() };
        Ok(())
    })
}
const _: exports::mluOpSetTensorDescriptor = mluOpSetTensorDescriptor;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpDestroyTensorDescriptor(d: *mut c_void) -> Status {
    guarded("mluOpDestroyTensorDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor is null".into())?;
        // SAFETY: made by mluOpCreateTensorDescriptor, destroyed once.
        drop(unsafe { Box::from_raw(d as *mut TensorDesc) });
        Ok(())
    })
}
const _: exports::mluOpDestroyTensorDescriptor = mluOpDestroyTensorDescriptor;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpCreateSparseConvolutionDescriptor(d: *mut *mut c_void) -> Status {
    guarded("mluOpCreateSparseConvolutionDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor out-pointer is null".into())?;
        // SAFETY: the caller's out-pointer.
        unsafe { *d = Box::into_raw(Box::<SparseConv>::default()).cast() };
        Ok(())
    })
}
const _: exports::mluOpCreateSparseConvolutionDescriptor = mluOpCreateSparseConvolutionDescriptor;

fn three(p: *const c_int, what: &str) -> Result<[i32; 3], Status> {
    require(!p.is_null(), BAD_PARAM, || format!("{what} is null"))?;
    // SAFETY: a 3-D convolution's arrays hold three ints (dimNb 5).
    Ok(unsafe { [*p, *p.add(1), *p.add(2)] })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpSetSparseConvolutionDescriptor(
    d: *mut c_void,
    dim_nb: c_int,
    batch: c_int,
    pad: *const c_int,
    stride: *const c_int,
    dilation: *const c_int,
    input: *const c_int,
    filter: *const c_int,
    output: *const c_int,
    sub_m: c_int,
    transpose: c_int,
    inverse: c_int,
) -> Status {
    guarded("mluOpSetSparseConvolutionDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor is null".into())?;
        require(dim_nb == 5, BAD_PARAM, || {
            format!("dimNb {dim_nb}: only 3-D (dimNb 5) sparse convolutions")
        })?;
        // get_indice_pairs_structs.cpp:77-88 at v1.4.0: no transpose, no inverse.
        require(transpose == 0 && inverse == 0, BAD_PARAM, || {
            format!("transpose {transpose}, inverse {inverse}: must be 0")
        })?;
        require(batch > 0, BAD_PARAM, || format!("batch {batch}"))?;
        let s = SparseConv {
            set: true,
            batch,
            pad: three(pad, "pad")?,
            stride: three(stride, "stride")?,
            dilation: three(dilation, "dilation")?,
            input: three(input, "input_space")?,
            filter: three(filter, "filter_space")?,
            output: three(output, "output_space")?,
            sub_m,
            num_act_out: 0,
        };
        let positive = |a: &[i32; 3]| a.iter().all(|&x| x > 0);
        require(s.pad.iter().all(|&x| x >= 0), BAD_PARAM, || format!("pad {:?}", s.pad))?;
        require(
            positive(&s.stride)
                && positive(&s.dilation)
                && positive(&s.input)
                && positive(&s.filter)
                && positive(&s.output),
            BAD_PARAM,
            || "stride, dilation and the spaces must be positive".into(),
        )?;
        require(sub_m == 0 || sub_m == 1, BAD_PARAM, || format!("sub_m {sub_m}: 0 or 1"))?;
        // SAFETY: made by mluOpCreateSparseConvolutionDescriptor.
        unsafe { *(d as *mut SparseConv) = s };
        Ok(())
    })
}
const _: exports::mluOpSetSparseConvolutionDescriptor = mluOpSetSparseConvolutionDescriptor;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetSparseConvolutionNumActOut(
    d: *mut c_void,
    n: *mut c_int,
) -> Status {
    guarded("mluOpGetSparseConvolutionNumActOut", || {
        require(!d.is_null() && !n.is_null(), BAD_PARAM, || {
            "null descriptor or out-pointer".into()
        })?;
        // SAFETY: made by mluOpCreateSparseConvolutionDescriptor; the caller's out-pointer.
        unsafe { *n = (*(d as *const SparseConv)).num_act_out };
        Ok(())
    })
}
const _: exports::mluOpGetSparseConvolutionNumActOut = mluOpGetSparseConvolutionNumActOut;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpDestroySparseConvolutionDescriptor(d: *mut c_void) -> Status {
    guarded("mluOpDestroySparseConvolutionDescriptor", || {
        require(!d.is_null(), BAD_PARAM, || "descriptor is null".into())?;
        // SAFETY: made by mluOpCreateSparseConvolutionDescriptor, destroyed once.
        drop(unsafe { Box::from_raw(d as *mut SparseConv) });
        Ok(())
    })
}
const _: exports::mluOpDestroySparseConvolutionDescriptor = mluOpDestroySparseConvolutionDescriptor;

mod operators;
pub use operators::*;

//! Borrowed tensors passed between the host (ONNX Runtime, tests, benches) and the
//! operator kernels. Inputs are read-only views; outputs are buffers the host allocated
//! with the shapes the operator planned.

use crate::error::{Error, Result};
use crate::scratch::filled;
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    I32,
    I64,
}

impl DType {
    /// The ONNX type string used in schemas/<family>/*.json.
    pub fn onnx_name(self) -> &'static str {
        match self {
            DType::F32 => "tensor(float)",
            DType::F16 => "tensor(float16)",
            DType::I32 => "tensor(int32)",
            DType::I64 => "tensor(int64)",
        }
    }
    pub fn from_onnx_name(s: &str) -> Option<Self> {
        [DType::F32, DType::F16, DType::I32, DType::I64].into_iter().find(|d| d.onnx_name() == s)
    }
    pub fn size(self) -> usize {
        match self {
            DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

/// The data of one input tensor.
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    /// `len` elements of `dtype` that stay in card memory: the host sees the shape only
    /// (the MLU path's shape rules).
    OnCard {
        dtype: DType,
        len: usize,
    },
}

impl Data<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F16(_) => DType::F16,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::OnCard { dtype, .. } => *dtype,
        }
    }
    fn len(&self) -> usize {
        match self {
            Data::F32(d) => d.len(),
            Data::F16(d) => d.len(),
            Data::I32(d) => d.len(),
            Data::I64(d) => d.len(),
            Data::OnCard { len, .. } => *len,
        }
    }
}

/// A read-only tensor: shape (as given by the host, so possibly negative dims from a
/// broken host are caught here) and row-major data.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub shape: Vec<i64>,
    pub data: Data<'a>,
}

/// A typed view after validation: shape in `usize`, data of one element type.
#[derive(Debug, Clone, Copy)]
pub struct View<'a, T> {
    pub shape: &'a [usize],
    pub data: &'a [T],
}

/// The inputs of one node, with the schema names used in error messages.
pub struct Inputs<'a> {
    names: Vec<String>,
    tensors: Vec<Option<TensorRef<'a>>>,
    shapes: Vec<Vec<usize>>,
}

/// Element types a kernel can ask for.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn from_data<'a>(d: &Data<'a>) -> Option<&'a [Self]>;
}

macro_rules! element {
    ($t:ty, $v:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$v;
            fn from_data<'a>(d: &Data<'a>) -> Option<&'a [Self]> {
                match *d {
                    Data::$v(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f16, F16);
element!(i32, I32);
element!(i64, I64);

impl<'a> Inputs<'a> {
    /// `names` are the schema's input names; `tensors[i]` is `None` for an absent optional
    /// input. Shapes are checked once here: no negative dimension, element count matching
    /// the data length.
    pub fn new(names: Vec<String>, tensors: Vec<Option<TensorRef<'a>>>) -> Result<Self> {
        let mut shapes = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let name = names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
            let shape = match t {
                None => Vec::new(),
                Some(t) => {
                    let mut dims = Vec::with_capacity(t.shape.len());
                    for &d in &t.shape {
                        dims.push(usize::try_from(d).map_err(|_| {
                            Error::input(
                                &name,
                                format!("negative dimension in shape {:?}", t.shape),
                            )
                        })?);
                    }
                    let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                    if count != Some(t.data.len()) {
                        return Err(Error::input(
                            &name,
                            format!(
                                "shape {:?} does not match {} data elements",
                                t.shape,
                                t.data.len()
                            ),
                        ));
                    }
                    dims
                }
            };
            shapes.push(shape);
        }
        Ok(Inputs { names, tensors, shapes })
    }

    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or("?", String::as_str)
    }

    pub fn is_present(&self, i: usize) -> bool {
        matches!(self.tensors.get(i), Some(Some(_)))
    }

    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.tensors.get(i)?.as_ref().map(|t| t.data.dtype())
    }

    /// Input `i`'s element count, `None` when absent.
    pub fn numel(&self, i: usize) -> Option<usize> {
        self.tensors.get(i)?.as_ref().map(|t| t.data.len())
    }

    /// An error about input `i`.
    pub fn error(&self, i: usize, rule: impl Into<String>) -> Error {
        Error::input(self.name(i), rule)
    }

    /// Input `i`'s shape, checking it is present and of element type `T` (its values may
    /// be on the card).
    pub fn shape_of<T: Element>(&self, i: usize) -> Result<&[usize]> {
        let t = self
            .tensors
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.error(i, "required input is missing"))?;
        if t.data.dtype() != T::DTYPE {
            return Err(self.error(
                i,
                format!(
                    "expected dtype {}, got {}",
                    T::DTYPE.onnx_name(),
                    t.data.dtype().onnx_name()
                ),
            ));
        }
        Ok(&self.shapes[i])
    }

    /// Input `i` as a view of element type `T`; an error if absent or of another dtype.
    pub fn get<T: Element>(&self, i: usize) -> Result<View<'_, T>> {
        let shape = self.shape_of::<T>(i)?;
        let data =
            self.tensors[i].as_ref().and_then(|t| T::from_data(&t.data)).ok_or_else(|| {
                Error::Runtime(format!(
                    "input '{}': its values are in card memory, not on the host",
                    self.name(i)
                ))
            })?;
        Ok(View { shape, data })
    }

    /// Like [`shape_of`](Self::shape_of), checking the rank and the dimensions given as
    /// `Some`; errors name the input and the expected shape.
    pub fn shaped<T: Element>(
        &self,
        i: usize,
        expected: &[Option<usize>],
        pattern: &str,
    ) -> Result<&[usize]> {
        let shape = self.shape_of::<T>(i)?;
        let ok = shape.len() == expected.len()
            && shape.iter().zip(expected).all(|(&d, e)| e.is_none_or(|e| e == d));
        if ok {
            Ok(shape)
        } else {
            Err(self.error(i, format!("expected shape {pattern}, got {shape:?}")))
        }
    }

    /// Like [`get`](Self::get) but `None` when the optional input is absent.
    pub fn get_optional<T: Element>(&self, i: usize) -> Result<Option<View<'_, T>>> {
        if self.is_present(i) { self.get(i).map(Some) } else { Ok(None) }
    }

    /// Input `i` as `T`, checking its rank and the dimensions given as `Some`.
    /// Returns the view; errors name the input and the expected shape.
    pub fn get_shaped<T: Element>(
        &self,
        i: usize,
        expected: &[Option<usize>],
        pattern: &str,
    ) -> Result<View<'_, T>> {
        self.shaped::<T>(i, expected, pattern)?;
        self.get::<T>(i)
    }
}

/// Allocates the outputs of one node once their specs are known (ONNX Runtime's
/// KernelContext_GetOutput, or owned buffers).
pub trait OutputHost {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>>;
}

/// One output buffer, allocated by the host with the planned shape.
#[derive(Debug, Default)]
pub enum OutData<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
    #[default]
    Taken,
}

/// Output element types.
pub trait OutElement: Element {
    fn take<'a>(d: OutData<'a>) -> std::result::Result<&'a mut [Self], OutData<'a>>;
}

macro_rules! out_element {
    ($t:ty, $v:ident) => {
        impl OutElement for $t {
            fn take<'a>(d: OutData<'a>) -> std::result::Result<&'a mut [Self], OutData<'a>> {
                match d {
                    OutData::$v(s) => Ok(s),
                    other => Err(other),
                }
            }
        }
    };
}
out_element!(f32, F32);
out_element!(f16, F16);
out_element!(i32, I32);
out_element!(i64, I64);

/// The planned shape and dtype of one output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl OutputSpec {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        OutputSpec { dtype, shape: shape.into() }
    }
    /// Saturates, so an impossible size fails to allocate instead of wrapping to a small one.
    pub fn numel(&self) -> usize {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX)
    }
    /// The buffer's size in bytes (saturating, as [`Self::numel`]).
    pub fn bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }
}

/// The output buffers of one node. Each buffer can be taken once, so a kernel can hold
/// several outputs mutably at the same time.
pub struct Outputs<'a> {
    names: Vec<String>,
    data: Vec<OutData<'a>>,
}

impl<'a> Outputs<'a> {
    pub fn new(names: Vec<String>, data: Vec<OutData<'a>>) -> Self {
        Outputs { names, data }
    }

    /// Takes output `i` as a mutable slice of `T`.
    pub fn take<T: OutElement>(&mut self, i: usize) -> Result<&'a mut [T]> {
        let name = self.names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
        let slot =
            self.data.get_mut(i).ok_or_else(|| Error::output(&name, "output is not allocated"))?;
        T::take(std::mem::take(slot)).map_err(|other| {
            Error::Runtime(format!(
                "output '{name}': host allocated {other:?}-typed buffer, kernel expected {}",
                T::DTYPE.onnx_name()
            ))
        })
    }
}

/// Owned output storage for hosts that are not ONNX Runtime (tests, benches, the MLU
/// emulator path).
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl OwnedData {
    /// A buffer filled with a poison value (NaN, or the most negative integer) rather than
    /// zeros: like ONNX Runtime, which hands kernels uninitialised outputs, it makes a kernel
    /// that leaves an element unwritten visible in the tests.
    /// Sizes come from inputs and attributes, so the allocation is fallible: `what` names
    /// the buffer in the out-of-memory error.
    pub fn poisoned(spec: &OutputSpec, what: &str) -> Result<Self> {
        let n = spec.numel();
        Ok(match spec.dtype {
            DType::F32 => OwnedData::F32(filled(n, f32::NAN, what)?),
            DType::F16 => OwnedData::F16(filled(n, f16::NAN, what)?),
            DType::I32 => OwnedData::I32(filled(n, i32::MIN, what)?),
            DType::I64 => OwnedData::I64(filled(n, i64::MIN, what)?),
        })
    }
    pub fn as_out(&mut self) -> OutData<'_> {
        match self {
            OwnedData::F32(v) => OutData::F32(v),
            OwnedData::F16(v) => OutData::F16(v),
            OwnedData::I32(v) => OutData::I32(v),
            OwnedData::I64(v) => OutData::I64(v),
        }
    }
    /// The address of the first element (for copies of `numel * dtype.size()` bytes).
    pub fn as_ptr(&self) -> *const std::ffi::c_void {
        match self {
            OwnedData::F32(v) => v.as_ptr().cast(),
            OwnedData::F16(v) => v.as_ptr().cast(),
            OwnedData::I32(v) => v.as_ptr().cast(),
            OwnedData::I64(v) => v.as_ptr().cast(),
        }
    }
    /// As [`Self::as_ptr`], for writing.
    pub fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        match self {
            OwnedData::F32(v) => v.as_mut_ptr().cast(),
            OwnedData::F16(v) => v.as_mut_ptr().cast(),
            OwnedData::I32(v) => v.as_mut_ptr().cast(),
            OwnedData::I64(v) => v.as_mut_ptr().cast(),
        }
    }
    pub fn as_data(&self) -> Data<'_> {
        match self {
            OwnedData::F32(v) => Data::F32(v),
            OwnedData::F16(v) => Data::F16(v),
            OwnedData::I32(v) => Data::I32(v),
            OwnedData::I64(v) => Data::I64(v),
        }
    }
    pub fn f32(&self) -> Option<&[f32]> {
        if let OwnedData::F32(v) = self { Some(v) } else { None }
    }
    pub fn f16(&self) -> Option<&[f16]> {
        if let OwnedData::F16(v) = self { Some(v) } else { None }
    }
    pub fn i32(&self) -> Option<&[i32]> {
        if let OwnedData::I32(v) = self { Some(v) } else { None }
    }
}

/// An owned tensor: what the direct Rust API returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: OwnedData,
}

impl Tensor {
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            shape: self.shape.iter().map(|&d| d as i64).collect(),
            data: self.data.as_data(),
        }
    }
    pub fn f32(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Self {
        Tensor { shape: shape.into(), data: OwnedData::F32(data) }
    }
    pub fn f16(shape: impl Into<Vec<usize>>, data: Vec<f16>) -> Self {
        Tensor { shape: shape.into(), data: OwnedData::F16(data) }
    }
    pub fn i32(shape: impl Into<Vec<usize>>, data: Vec<i32>) -> Self {
        Tensor { shape: shape.into(), data: OwnedData::I32(data) }
    }
    pub fn i64(shape: impl Into<Vec<usize>>, data: Vec<i64>) -> Self {
        Tensor { shape: shape.into(), data: OwnedData::I64(data) }
    }
}

/// One tensor in card memory as a kernel context holds it: element type, shape and address.
/// It goes unchanged from ONNX Runtime's context to the card backends.
#[derive(Debug, Clone)]
pub struct CardTensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub data: *mut std::ffi::c_void,
}

impl CardTensor {
    /// Its element type and dimensions as an output spec (an error for a negative dimension).
    pub fn spec(&self) -> Result<OutputSpec> {
        let dims = self
            .shape
            .iter()
            .map(|&x| usize::try_from(x))
            .collect::<std::result::Result<Vec<usize>, _>>()
            .map_err(|_| Error::Runtime(format!("negative dimension in {:?}", self.shape)))?;
        Ok(OutputSpec::new(self.dtype, dims))
    }
}

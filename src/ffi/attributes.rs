//! The one attribute reader: a node's attributes as the schema's `Attrs` asks for them, read
//! either through the kernel info (kernel creation: custom ops and EP kernels) or through the
//! graph node (partitioning: `GetCapability`). Both answer the same three ways: the value,
//! absent (the schema default applies), or an error (the attribute has another type).

use super::graph::Node;
use super::kernel::KernelInfo;
use super::{api, attribute_text, check, cstring, read_bytes};
use crate::error::{Error, Result};
use crate::schema::{AttrKind, AttrValue, AttributeSource};
use ort_sys::{OrtErrorCode, OrtOpAttr, OrtOpAttrType};
use std::ffi::{CStr, c_void};

/// Where a node's attributes are read from.
#[derive(Clone, Copy)]
pub enum Attributes<'a> {
    /// `KernelInfoGetAttribute*` (kernel creation).
    Kernel(KernelInfo<'a>),
    /// `Node_GetAttributeByName` + `ReadOpAttr` (partitioning).
    Node(Node<'a>),
}

impl AttributeSource for Attributes<'_> {
    fn get(&self, name: &str, kind: AttrKind) -> Result<Option<AttrValue>> {
        let cname = cstring(name);
        match *self {
            Attributes::Kernel(info) => from_kernel_info(info, &cname, kind),
            Attributes::Node(node) => from_node(node, &cname, kind),
        }
        .map_err(|m| Error::Runtime(format!("expected type {kind:?}: {m}")))
    }
}

/// ONNX Runtime's answer to `KernelInfoGetAttribute*` for an attribute the node does not
/// have is ORT_FAIL, the same code as for a type mismatch, so only its text tells them apart
/// (1.31.1: "No attribute with name:'<name>'is defined." for scalars, "No attribute with
/// this name is defined." for lists). The one place that reads ORT's text; tests pin it
/// (tests/ort_session.rs, absent attributes take their defaults, a mistyped one is an error).
fn kernel_info_lacks_it(e: &Error) -> bool {
    matches!(e, Error::Ort { code: OrtErrorCode::ORT_FAIL, message }
        if message.contains("No attribute with name") || message.contains("No attribute with this name"))
}

/// The value read, absent (`None`), or ORT's error for any other failure.
fn answer<T>(read: Result<T>) -> Result<Option<T>> {
    match read {
        Ok(v) => Ok(Some(v)),
        Err(e) if kernel_info_lacks_it(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn from_kernel_info(
    info: KernelInfo<'_>,
    name: &CStr,
    kind: AttrKind,
) -> Result<Option<AttrValue>> {
    let (api, p, name) = (api(), info.ptr, name.as_ptr());
    match kind {
        AttrKind::Int => {
            let mut v = 0i64;
            // SAFETY: the info is live (Handle::from_raw's contract); valid out pointer.
            answer(
                check(unsafe { (api.KernelInfoGetAttribute_int64)(p, name, &mut v) })
                    .map(|()| AttrValue::Int(v)),
            )
        }
        AttrKind::Float => {
            let mut v = 0f32;
            // SAFETY: as above.
            answer(
                check(unsafe { (api.KernelInfoGetAttribute_float)(p, name, &mut v) })
                    .map(|()| AttrValue::Float(v)),
            )
        }
        AttrKind::String => {
            let bytes = answer(read_bytes(|buf, size| {
                // SAFETY: as above; `buf` is null (size query) or holds `*size` bytes.
                unsafe { (api.KernelInfoGetAttribute_string)(p, name, buf, size) }
            }))?;
            Ok(bytes.map(attribute_text).transpose()?.map(AttrValue::String))
        }
        AttrKind::Ints => {
            let mut n = 0usize;
            // SAFETY: as above; a size query with a null buffer.
            answer(
                check(unsafe {
                    (api.KernelInfoGetAttributeArray_int64)(p, name, std::ptr::null_mut(), &mut n)
                })
                .and_then(|()| {
                    let mut v = vec![0i64; n];
                    // SAFETY: `v` holds `n` values, the size ORT reported.
                    check(unsafe {
                        (api.KernelInfoGetAttributeArray_int64)(p, name, v.as_mut_ptr(), &mut n)
                    })?;
                    v.truncate(n);
                    Ok(AttrValue::Ints(v))
                }),
            )
        }
    }
}

fn from_node(node: Node<'_>, name: &CStr, kind: AttrKind) -> Result<Option<AttrValue>> {
    let Some(attr) = node.attribute(name)? else { return Ok(None) };
    let mut ty = OrtOpAttrType::ORT_OP_ATTR_UNDEFINED;
    // SAFETY: attr is a live attribute of the node; valid out pointer.
    check(unsafe { (api().OpAttr_GetType)(attr, &mut ty) })?;
    let want = match kind {
        AttrKind::Int => OrtOpAttrType::ORT_OP_ATTR_INT,
        AttrKind::Ints => OrtOpAttrType::ORT_OP_ATTR_INTS,
        AttrKind::Float => OrtOpAttrType::ORT_OP_ATTR_FLOAT,
        AttrKind::String => OrtOpAttrType::ORT_OP_ATTR_STRING,
    };
    if ty != want {
        return Err(Error::Runtime(format!("the node has {ty:?}")));
    }
    let bytes = read_op_attr(attr, ty)?;
    let ints = || {
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect::<Vec<_>>()
    };
    Ok(Some(match kind {
        AttrKind::Int => AttrValue::Int(
            *ints().first().ok_or_else(|| Error::Runtime("empty int attribute".into()))?,
        ),
        AttrKind::Ints => AttrValue::Ints(ints()),
        AttrKind::Float => AttrValue::Float(f32::from_ne_bytes(
            bytes
                .get(..4)
                .ok_or_else(|| Error::Runtime("empty float attribute".into()))?
                .try_into()
                .expect("4 bytes"),
        )),
        AttrKind::String => AttrValue::String(attribute_text(bytes)?),
    }))
}

/// Reads the raw bytes of an attribute's value. Scalars are read into a buffer of their
/// size; lists and strings ask `ReadOpAttr` for the size first. A scalar whose value field
/// is absent from the protobuf (writers may omit a 0) reads as 0, as through the kernel info
/// API: with the type checked and the buffer large enough, ORT_INVALID_ARGUMENT from
/// `ReadOpAttr` has no other cause ("Attribute has no int value.").
fn read_op_attr(a: *const OrtOpAttr, ty: OrtOpAttrType) -> Result<Vec<u8>> {
    let api = api();
    let scalar = match ty {
        OrtOpAttrType::ORT_OP_ATTR_INT => Some(8),
        OrtOpAttrType::ORT_OP_ATTR_FLOAT => Some(4),
        _ => None,
    };
    let needed = match scalar {
        Some(n) => n,
        None => {
            let mut needed = 0usize;
            // SAFETY: size query; ORT writes the required size (the status says the empty
            // buffer is too small and is dropped).
            let _ = check(unsafe { (api.ReadOpAttr)(a, ty, std::ptr::null_mut(), 0, &mut needed) });
            needed
        }
    };
    if needed == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; needed];
    let mut got = 0usize;
    // SAFETY: buf holds `needed` bytes.
    match check(unsafe {
        (api.ReadOpAttr)(a, ty, buf.as_mut_ptr().cast::<c_void>(), needed, &mut got)
    }) {
        Ok(()) => {
            buf.truncate(got);
            Ok(buf)
        }
        Err(Error::Ort { code: OrtErrorCode::ORT_INVALID_ARGUMENT, .. }) if scalar.is_some() => {
            Ok(vec![0u8; needed])
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(message: &str) -> Error {
        Error::Ort { code: OrtErrorCode::ORT_FAIL, message: message.into() }
    }

    #[test]
    fn an_absent_attribute_is_told_from_a_mistyped_one_by_onnxruntime_1_31_text() {
        assert!(kernel_info_lacks_it(&fail("No attribute with name:'stride'is defined.")));
        assert!(kernel_info_lacks_it(&fail("No attribute with this name is defined.")));
        assert!(!kernel_info_lacks_it(&fail("Attribute name and type don't match")));
        let too_small = Error::Ort {
            code: OrtErrorCode::ORT_INVALID_ARGUMENT,
            message: "No attribute with name".into(),
        };
        assert!(!kernel_info_lacks_it(&too_small), "only ORT_FAIL reports an absent attribute");
    }
}

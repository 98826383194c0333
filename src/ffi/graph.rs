//! The graph as `GetCapability` sees it: its nodes, each node's identity, declared input
//! shapes and attributes, and the support info through which the EP claims nodes.

use super::attributes::Attributes;
use super::ep_abi::{OrtEpGraphSupportInfo, OrtKernelDef};
use super::{Handle, api, check, ep_api, out_str};
use crate::error::{Error, Result};
use ort_sys::{OrtErrorCode, OrtGraph, OrtNode, OrtOpAttr, OrtValueInfo};
use std::ffi::CStr;

/// The graph handed to `GetCapability`.
pub type Graph<'a> = Handle<'a, OrtGraph>;
/// One node of a [`Graph`].
pub type Node<'a> = Handle<'a, OrtNode>;
/// What `GetCapability` reports back: the nodes the EP takes.
pub type SupportInfo<'a> = Handle<'a, OrtEpGraphSupportInfo>;

impl<'a> Graph<'a> {
    pub fn nodes(self) -> Result<Vec<Node<'a>>> {
        let api = api();
        let mut n = 0usize;
        // SAFETY: the graph is live (from_raw's contract); valid out pointer.
        check(unsafe { (api.Graph_GetNumNodes)(self.ptr, &mut n) })?;
        let mut nodes: Vec<*const OrtNode> = vec![std::ptr::null(); n];
        // SAFETY: `nodes` holds n slots.
        check(unsafe { (api.Graph_GetNodes)(self.ptr, nodes.as_mut_ptr(), n) })?;
        // SAFETY: the graph's nodes live as long as the graph.
        Ok(nodes.into_iter().map(|ptr| unsafe { Node::from_raw(ptr) }).collect())
    }
}

impl<'a> Node<'a> {
    pub fn domain(self) -> Result<String> {
        // SAFETY: the node belongs to a live graph; `p` is a valid out pointer.
        out_str(|p| unsafe { (api().Node_GetDomain)(self.ptr, p) })
    }

    pub fn op_type(self) -> Result<String> {
        // SAFETY: as above.
        out_str(|p| unsafe { (api().Node_GetOperatorType)(self.ptr, p) })
    }

    pub fn name(self) -> Result<String> {
        // SAFETY: as above.
        out_str(|p| unsafe { (api().Node_GetName)(self.ptr, p) })
    }

    pub fn attributes(self) -> Attributes<'a> {
        Attributes::Node(self)
    }

    /// The attribute `name`, or `None` when the node does not have it: ONNX Runtime answers
    /// an unknown name with ORT_NOT_FOUND, an unset optional one with a null attribute.
    pub(super) fn attribute(self, name: &CStr) -> Result<Option<*const OrtOpAttr>> {
        let mut attr: *const OrtOpAttr = std::ptr::null();
        // SAFETY: the node is live; `name` is NUL-terminated; valid out pointer.
        match check(unsafe { (api().Node_GetAttributeByName)(self.ptr, name.as_ptr(), &mut attr) })
        {
            Ok(()) => Ok((!attr.is_null()).then_some(attr)),
            Err(Error::Ort { code: OrtErrorCode::ORT_NOT_FOUND, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The input shapes the graph declares: `None` for an absent input or one that is not a
    /// tensor, `None` for a dimension that is symbolic or unknown.
    pub fn input_shapes(self) -> Result<Vec<Option<Vec<Option<usize>>>>> {
        let api = api();
        let mut n = 0usize;
        // SAFETY: the node is live; valid out pointers throughout.
        check(unsafe { (api.Node_GetNumInputs)(self.ptr, &mut n) })?;
        let mut inputs: Vec<*const OrtValueInfo> = vec![std::ptr::null(); n];
        // SAFETY: `inputs` holds n slots.
        check(unsafe { (api.Node_GetInputs)(self.ptr, inputs.as_mut_ptr(), n) })?;
        let mut shapes = Vec::with_capacity(n);
        for v in inputs {
            if v.is_null() {
                shapes.push(None);
                continue;
            }
            let mut type_info = std::ptr::null();
            let mut tensor = std::ptr::null();
            let mut rank = 0usize;
            // SAFETY: v is a live value info of the node; the type info it returns is owned by
            // the graph.
            unsafe {
                check((api.GetValueInfoTypeInfo)(v, &mut type_info))?;
                check((api.CastTypeInfoToTensorInfo)(type_info, &mut tensor))?;
            }
            if tensor.is_null() {
                shapes.push(None);
                continue;
            }
            // SAFETY: tensor is a live shape info.
            check(unsafe { (api.GetDimensionsCount)(tensor, &mut rank) })?;
            let mut dims = vec![0i64; rank];
            // SAFETY: dims holds rank values.
            check(unsafe { (api.GetDimensions)(tensor, dims.as_mut_ptr(), rank) })?;
            shapes.push(Some(dims.into_iter().map(|d| usize::try_from(d).ok()).collect()));
        }
        Ok(shapes)
    }
}

impl SupportInfo<'_> {
    /// Whether the EP's kernel registry has a kernel for `node`.
    pub fn has_kernel(self, node: Node<'_>) -> Result<bool> {
        let mut def: *const OrtKernelDef = std::ptr::null();
        // SAFETY: the support info and the node are live; valid out pointer.
        check(unsafe { (ep_api().EpGraphSupportInfo_LookUpKernel)(self.ptr, node.ptr, &mut def) })?;
        Ok(!def.is_null())
    }

    /// Assigns `node` to the EP.
    pub fn claim(self, node: Node<'_>) -> Result<()> {
        // SAFETY: the support info and the node are live.
        check(unsafe { (ep_api().EpGraphSupportInfo_AddSingleNode)(self.ptr, node.ptr) })
    }
}

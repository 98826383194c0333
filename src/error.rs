//! Errors of the operator layer. Every contract violation becomes one of these; the C
//! boundary (src/ffi/) turns it into an ONNX Runtime status whose message names the op,
//! the node, the tensor or attribute, and the rule.

use ort_sys::OrtErrorCode;
use thiserror::Error;

/// The one error type of the crate. src/ffi turns it into an ONNX Runtime status in one
/// place (`ffi::guard`), with [`Error::code`] as the status code.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// An attribute is missing, has the wrong type, or violates a rule of docs/CONTRACT.md.
    #[error("attribute '{name}': {rule}")]
    Attribute { name: String, rule: String },
    /// An input tensor violates a shape, dtype or value rule.
    #[error("input '{name}': {rule}")]
    Input { name: String, rule: String },
    /// An output cannot be produced (for example its size overflows).
    #[error("output '{name}': {rule}")]
    Output { name: String, rule: String },
    /// A caller of our C entry points passed what the API does not allow (null or short
    /// output arrays, a foreign memory info).
    #[error("{0}")]
    Argument(String),
    /// A failure of the host runtime (ONNX Runtime or the MLU runtime), not of the input.
    #[error("{0}")]
    Runtime(String),
    /// An ONNX Runtime call failed with this status code and message.
    #[error("{message}")]
    Ort { code: OrtErrorCode, message: String },
    /// A card path does not run this node, and why: its configuration, its static sizes, or
    /// sizes known only at run time (int32 offsets, on-chip rows, a library's NOT_SUPPORTED).
    /// The node runs on the next card path, or on its CPU kernel.
    #[error("{0}")]
    Declined(String),
    /// An error at one node of one operator: what a kernel reports to ONNX Runtime.
    #[error("mluops.{op} node '{node}': {error}")]
    Node { op: &'static str, node: String, error: Box<Error> },
}

impl Error {
    pub fn attribute(name: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::Attribute { name: name.into(), rule: rule.into() }
    }
    pub fn input(name: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::Input { name: name.into(), rule: rule.into() }
    }
    pub fn output(name: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::Output { name: name.into(), rule: rule.into() }
    }
    pub fn declined(why: impl Into<String>) -> Self {
        Error::Declined(why.into())
    }
    /// This error located at node `node` of operator `op`.
    pub fn at(self, op: &'static str, node: &str) -> Self {
        Error::Node { op, node: node.to_owned(), error: Box::new(self) }
    }
    /// The ONNX Runtime status code: INVALID_ARGUMENT for what the model, its inputs or the
    /// caller got wrong, an ONNX Runtime call's own code, FAIL otherwise.
    pub fn code(&self) -> OrtErrorCode {
        match self {
            Error::Attribute { .. }
            | Error::Input { .. }
            | Error::Output { .. }
            | Error::Argument(_) => OrtErrorCode::ORT_INVALID_ARGUMENT,
            Error::Ort { code, .. } => *code,
            Error::Node { error, .. } => error.code(),
            Error::Runtime(_) | Error::Declined(_) => OrtErrorCode::ORT_FAIL,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

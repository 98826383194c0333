//! Errors of the operator layer. Every contract violation becomes one of these; the C
//! boundary (src/ffi/) turns it into an ONNX Runtime status whose message names the op,
//! the node, the tensor or attribute, and the rule.

use thiserror::Error;

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
    /// A failure of the host runtime (ONNX Runtime or the MLU runtime), not of the input.
    #[error("{0}")]
    Runtime(String),
    /// Valid input whose sizes exceed what the MLU kernels address (int32 offsets, on-chip
    /// rows), found only at run time: the execution provider runs the node's CPU kernel
    /// instead.
    #[error("{0}")]
    MluLimit(String),
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
    /// True for errors caused by the model or its inputs (reported as INVALID_ARGUMENT).
    pub fn is_invalid_argument(&self) -> bool {
        !matches!(self, Error::Runtime(_) | Error::MluLimit(_))
    }
}

/// An [`Error`] located at one node of one operator: what crosses the C boundary.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("mluops.{op} node '{node}': {error}")]
pub struct NodeError {
    pub op: &'static str,
    pub node: String,
    pub error: Error,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

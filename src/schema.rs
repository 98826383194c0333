//! The operator schemas of schemas/<family>/*.json: the single source of truth for op names,
//! inputs, outputs, type constraints and attribute defaults. Registration with ONNX
//! Runtime and attribute parsing are both derived from them.

use crate::error::{Error, Result};
use crate::tensor::DType;
use serde::Deserialize;
use std::sync::{Mutex, PoisonError};

pub const DOMAIN: &str = "mluops";
pub const OPSET_VERSION: i32 = 1;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    pub domain: String,
    pub op_type: String,
    pub since_version: i32,
    pub doc: String,
    pub inputs: Vec<Formal>,
    pub outputs: Vec<Formal>,
    #[serde(default)]
    pub type_constraints: Vec<TypeConstraint>,
    #[serde(default)]
    pub attributes: Vec<Attribute>,
}

/// An input or output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Formal {
    pub name: String,
    /// Either an ONNX tensor type (`tensor(int32)`) or the name of a type constraint.
    pub type_str: String,
    /// Symbolic shape, for documentation, e.g. `[B, N, 3]`.
    pub shape: String,
    #[serde(default)]
    pub optional: bool,
    pub doc: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeConstraint {
    pub type_str: String,
    pub allowed_types: Vec<String>,
    pub doc: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttrKind {
    Int,
    Ints,
    Float,
    String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attribute {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: AttrKind,
    pub required: bool,
    #[serde(default)]
    pub default: Option<serde_json::Value>,
    pub doc: String,
}

/// An attribute value, as read from a node or from a schema default.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    String(String),
}

impl Schema {
    /// The dtypes an input or output may take: one for a fixed type, several for a
    /// constraint such as `T`.
    pub fn allowed(&self, formal: &Formal) -> Vec<DType> {
        match self.type_constraints.iter().find(|c| c.type_str == formal.type_str) {
            Some(c) => c.allowed_types.iter().filter_map(|t| DType::from_onnx_name(t)).collect(),
            None => DType::from_onnx_name(&formal.type_str).into_iter().collect(),
        }
    }

    /// The type-constraint bindings to register: one kernel per allowed type of the
    /// (at most one) constraint, or a single binding when there is none.
    pub fn bindings(&self) -> Vec<Option<(String, DType)>> {
        match self.type_constraints.first() {
            None => vec![None],
            Some(c) => self
                .allowed_for_constraint(c)
                .into_iter()
                .map(|d| Some((c.type_str.clone(), d)))
                .collect(),
        }
    }

    fn allowed_for_constraint(&self, c: &TypeConstraint) -> Vec<DType> {
        c.allowed_types.iter().filter_map(|t| DType::from_onnx_name(t)).collect()
    }

    /// The dtype of a formal under a binding.
    pub fn dtype(&self, formal: &Formal, binding: &Option<(String, DType)>) -> DType {
        match binding {
            Some((name, d)) if *name == formal.type_str => *d,
            _ => DType::from_onnx_name(&formal.type_str).unwrap_or_else(|| {
                panic!("schema {}: unbound type {}", self.op_type, formal.type_str)
            }),
        }
    }

    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|f| f.name.clone()).collect()
    }

    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|f| f.name.clone()).collect()
    }

    pub fn attribute(&self, name: &str) -> Option<&Attribute> {
        self.attributes.iter().find(|a| a.name == name)
    }
}

impl Attribute {
    /// The schema default as a typed value.
    pub fn default_value(&self) -> Option<AttrValue> {
        let v = self.default.as_ref()?;
        Some(match self.kind {
            AttrKind::Int => AttrValue::Int(v.as_i64()?),
            AttrKind::Ints => {
                AttrValue::Ints(v.as_array()?.iter().map(|x| x.as_i64()).collect::<Option<_>>()?)
            }
            AttrKind::Float => AttrValue::Float(v.as_f64()? as f32),
            AttrKind::String => AttrValue::String(v.as_str()?.to_owned()),
        })
    }
}

impl Schema {
    /// Parses an operator's schema file. A malformed schema is a build defect caught by the
    /// schema tests, so this panics (never across the C boundary: callers there run inside
    /// catch_unwind).
    pub fn parse(op_type: &str, text: &str) -> Schema {
        let s: Schema =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("schema of {op_type}: {e}"));
        assert_eq!(s.op_type, op_type, "schema file holds another op");
        s
    }
}

/// An operator's embedded schema text, parsed once per process and kept by name: here, below
/// both the registry and the `Operator` trait, so that neither looks the other up.
pub fn embedded(op_type: &'static str, text: &'static str) -> &'static Schema {
    static PARSED: Mutex<Vec<&'static Schema>> = Mutex::new(Vec::new());
    let mut parsed = PARSED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = parsed.iter().find(|s| s.op_type == op_type) {
        return s;
    }
    let s: &'static Schema = Box::leak(Box::new(Schema::parse(op_type, text)));
    parsed.push(s);
    s
}

/// Where a node's attributes come from: an ONNX Runtime kernel info, or a map in tests.
pub trait AttributeSource {
    /// The attribute's value if the node sets it; an error if it is set with
    /// another type.
    fn get(&self, name: &str, kind: AttrKind) -> Result<Option<AttrValue>>;
}

impl AttributeSource for std::collections::HashMap<String, AttrValue> {
    fn get(&self, name: &str, kind: AttrKind) -> Result<Option<AttrValue>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                let matches = matches!(
                    (v, kind),
                    (AttrValue::Int(_), AttrKind::Int)
                        | (AttrValue::Ints(_), AttrKind::Ints)
                        | (AttrValue::Float(_), AttrKind::Float)
                        | (AttrValue::String(_), AttrKind::String)
                );
                if matches {
                    Ok(Some(v.clone()))
                } else {
                    Err(Error::Runtime(format!("expected type {kind:?}, got {v:?}")))
                }
            }
        }
    }
}

/// Reads a node's attributes with the schema's types and defaults.
pub struct Attrs<'a> {
    schema: &'static Schema,
    source: &'a dyn AttributeSource,
}

impl<'a> Attrs<'a> {
    pub fn new(schema: &'static Schema, source: &'a dyn AttributeSource) -> Self {
        Attrs { schema, source }
    }

    fn value(&self, name: &str, kind: AttrKind) -> Result<AttrValue> {
        let decl = self.schema.attribute(name).filter(|a| a.kind == kind).unwrap_or_else(|| {
            panic!("{}: attribute {name} ({kind:?}) is not in the schema", self.schema.op_type)
        });
        match self.source.get(name, kind).map_err(|e| Error::attribute(name, e.to_string()))? {
            Some(v) => Ok(v),
            None if decl.required => Err(Error::attribute(name, "required attribute is missing")),
            None => decl.default_value().ok_or_else(|| {
                Error::Runtime(format!("schema default of attribute '{name}' is malformed"))
            }),
        }
    }

    pub fn int(&self, name: &str) -> Result<i64> {
        match self.value(name, AttrKind::Int)? {
            AttrValue::Int(v) => Ok(v),
            other => Err(Error::attribute(name, format!("expected an int, got {other:?}"))),
        }
    }

    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        match self.value(name, AttrKind::Ints)? {
            AttrValue::Ints(v) => Ok(v),
            other => Err(Error::attribute(name, format!("expected ints, got {other:?}"))),
        }
    }

    /// An `ints` attribute that must hold exactly `N` values.
    pub fn ints_n<const N: usize>(&self, name: &str) -> Result<[i64; N]> {
        let v = self.ints(name)?;
        <[i64; N]>::try_from(v.as_slice()).map_err(|_| {
            Error::attribute(name, format!("expected {N} values, got {}: {v:?}", v.len()))
        })
    }

    pub fn float(&self, name: &str) -> Result<f32> {
        match self.value(name, AttrKind::Float)? {
            AttrValue::Float(v) => Ok(v),
            other => Err(Error::attribute(name, format!("expected a float, got {other:?}"))),
        }
    }

    pub fn string(&self, name: &str) -> Result<String> {
        match self.value(name, AttrKind::String)? {
            AttrValue::String(v) => Ok(v),
            other => Err(Error::attribute(name, format!("expected a string, got {other:?}"))),
        }
    }
}

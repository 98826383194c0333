//! A small ONNX graph builder over `onnx-protobuf`, shared by the model builder
//! (models/build_models.rs) and the Rust session tests; each user takes what it needs, hence
//! the allowances below.
#![allow(dead_code, unused_imports)]

use onnx_protobuf::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TypeProto,
    ValueInfoProto, attribute_proto::AttributeType, tensor_proto::DataType,
    tensor_shape_proto::Dimension, type_proto,
};
use protobuf::Message;

/// IR version 10 (ONNX 1.16): understood by every ONNX Runtime >= 1.24.
pub const IR_VERSION: i64 = 10;
pub const ONNX_OPSET: i64 = 17;

pub use onnx_protobuf::tensor_proto::DataType as Elem;

/// A dimension: fixed or symbolic.
#[derive(Clone)]
pub enum Dim {
    Fixed(i64),
    Sym(&'static str),
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INT.into();
    a.i = v;
    a
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INTS.into();
    a.ints = v.to_vec();
    a
}

pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::FLOAT.into();
    a.f = v;
    a
}

pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRING.into();
    a.s = v.as_bytes().to_vec();
    a
}

fn value_info(name: &str, elem: DataType, dims: Option<&[Dim]>) -> ValueInfoProto {
    let mut t = type_proto::Tensor::new();
    t.elem_type = elem as i32;
    if let Some(dims) = dims {
        let shape = t.shape.mut_or_insert_default();
        for d in dims {
            let mut dim = Dimension::new();
            match d {
                Dim::Fixed(v) => dim.set_dim_value(*v),
                Dim::Sym(s) => dim.set_dim_param((*s).into()),
            }
            shape.dim.push(dim);
        }
    }
    let mut tp = TypeProto::new();
    tp.set_tensor_type(t);
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v.type_ = Some(tp).into();
    v
}

#[derive(Default)]
pub struct Graph {
    g: GraphProto,
}

impl Graph {
    pub fn new(name: &str) -> Self {
        let mut g = GraphProto::new();
        g.name = name.into();
        Graph { g }
    }

    /// A graph input; `dims = None` leaves the shape unknown.
    pub fn input(&mut self, name: &str, elem: DataType, dims: Option<&[Dim]>) -> &mut Self {
        self.g.input.push(value_info(name, elem, dims));
        self
    }

    pub fn output(&mut self, name: &str, elem: DataType, dims: Option<&[Dim]>) -> &mut Self {
        self.g.output.push(value_info(name, elem, dims));
        self
    }

    /// A constant initializer.
    pub fn initializer_i64(&mut self, name: &str, dims: &[i64], data: &[i64]) -> &mut Self {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.dims = dims.to_vec();
        t.data_type = DataType::INT64 as i32;
        t.int64_data = data.to_vec();
        self.g.initializer.push(t);
        self
    }

    /// A float32 constant initializer, stored as little-endian `raw_data` (as exporters
    /// write weights; `onnx.numpy_helper.to_array` reads it back bit for bit). `dims = []`
    /// is a scalar.
    pub fn initializer_f32(&mut self, name: &str, dims: &[i64], data: &[f32]) -> &mut Self {
        assert_eq!(
            dims.iter().product::<i64>() as usize,
            data.len(),
            "initializer {name}: dims and data disagree"
        );
        let mut t = TensorProto::new();
        t.name = name.into();
        t.dims = dims.to_vec();
        t.data_type = DataType::FLOAT as i32;
        t.raw_data = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.g.initializer.push(t);
        self
    }

    /// An int32 constant initializer (`dims = []` is a scalar).
    pub fn initializer_i32(&mut self, name: &str, dims: &[i64], data: &[i32]) -> &mut Self {
        assert_eq!(
            dims.iter().product::<i64>() as usize,
            data.len(),
            "initializer {name}: dims and data disagree"
        );
        let mut t = TensorProto::new();
        t.name = name.into();
        t.dims = dims.to_vec();
        t.data_type = DataType::INT32 as i32;
        t.int32_data = data.to_vec();
        self.g.initializer.push(t);
        self
    }

    /// A node; `domain` is "" for standard ONNX ops, "mluops" for ours. An empty input
    /// name marks an absent optional input.
    pub fn node(
        &mut self,
        name: &str,
        op_type: &str,
        domain: &str,
        inputs: &[&str],
        outputs: &[&str],
        attributes: Vec<AttributeProto>,
    ) -> &mut Self {
        let mut n = NodeProto::new();
        n.name = name.into();
        n.op_type = op_type.into();
        n.domain = domain.into();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        n.attribute = attributes;
        self.g.node.push(n);
        self
    }

    pub fn model(&self) -> ModelProto {
        let mut m = ModelProto::new();
        m.ir_version = IR_VERSION;
        m.producer_name = "onnxruntime-ep-mlu".into();
        for (domain, version) in [("", ONNX_OPSET), ("mluops", 1)] {
            let mut o = OperatorSetIdProto::new();
            o.domain = domain.into();
            o.version = version;
            m.opset_import.push(o);
        }
        m.graph = Some(self.g.clone()).into();
        m
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.model().write_to_bytes().expect("an in-memory ONNX model always serialises")
    }
}

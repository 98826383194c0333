//! docs/USAGE.md's Rust example (the document shows this file verbatim; a test compares them):
//! the custom-op library in an ONNX Runtime session through the `ort` crate, on
//! models/bevdepth.onnx (VoxelPoolingForward among standard ONNX nodes) with inputs made here.
//!
//! Cargo.toml: ort = { version = "=2.0.0-rc.15", default-features = false,
//!                     features = ["load-dynamic", "std", "api-24"] }
//! Run from the repository root after `cargo build --release --lib`:
//!     ORT_DYLIB_PATH=.venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1 \
//!         cargo run --example usage
use ort::session::Session;
use ort::value::{Tensor, TensorElementType, ValueType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // load-dynamic: ONNX Runtime's C library is opened at run time from this path.
    let Some(dylib) = std::env::var_os("ORT_DYLIB_PATH") else {
        eprintln!(
            "error: ORT_DYLIB_PATH is not set: set it to ONNX Runtime's libonnxruntime.so, e.g. the onnxruntime \
             wheel's onnxruntime/capi/libonnxruntime.so.1.31.1 (`source scripts/setup.sh` exports it)"
        );
        std::process::exit(2);
    };
    let env = ort::init_from(&dylib)?.with_name("usage").build()?;
    let mut session = Session::builder(&env)?
        .with_operator_library("target/release/libonnxruntime_ep_mlu.so")?
        .commit_from_file("models/bevdepth.onnx")?;

    // img_feats: camera features [4 images, 32 channels, 8 x 22]; geom_xyz: the (x, y, z)
    // cell of each of the 2 x 5632 frustum points in the 32 x 32 x 1 BEV grid (points on
    // cells outside it, here the border rows at -1 and 32, are dropped by the pooling).
    let img_feats: Vec<f32> =
        (0..4 * 32 * 8 * 22).map(|i| (i * 7919 % 1000) as f32 / 1000.0 - 0.5).collect();
    let geom_xyz: Vec<i32> = (0..2 * 5632).flat_map(|p| [p % 34 - 1, p / 34 % 34 - 1, 0]).collect();
    let feeds = ort::inputs![
        "img_feats" => Tensor::from_array(([4usize, 32, 8, 22], img_feats))?,
        "geom_xyz" => Tensor::from_array(([2usize, 5632, 3], geom_xyz))?,
    ];
    let outputs = session.run(feeds)?;

    for (name, value) in &outputs {
        let summary = match value.dtype() {
            ValueType::Tensor { ty: TensorElementType::Float32, .. } => {
                let (shape, data) = value.try_extract_tensor::<f32>()?;
                format!(
                    "float32 {shape:?}, sum of |x| {:.3}",
                    data.iter().map(|x| x.abs() as f64).sum::<f64>()
                )
            }
            ValueType::Tensor { ty: TensorElementType::Int32, .. } => {
                let (shape, data) = value.try_extract_tensor::<i32>()?;
                format!(
                    "int32 {shape:?}, {} of {} >= 0",
                    data.iter().filter(|&&x| x >= 0).count(),
                    data.len()
                )
            }
            other => format!("{other:?}"),
        };
        println!("{name}: {summary}");
    }
    Ok(())
}

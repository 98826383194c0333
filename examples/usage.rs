//! docs/USAGE.md's Rust example (the document shows this file verbatim; a test compares them):
//! the custom-op library in an ONNX Runtime session through the `ort` crate, on bevdepth.onnx
//! (VoxelPoolingForward among standard ONNX nodes) with inputs made here.
//!
//! Cargo.toml: ort = { version = "=2.0.0-rc.15", default-features = false,
//!                     features = ["load-dynamic", "std", "api-24"] }
//! It runs from any folder, on three paths (each missing one is named in a one-line error):
//!   ORT_DYLIB_PATH  ONNX Runtime's C library (required);
//!   MLU_EP_LIB      libonnxruntime_ep_mlu.so (default: target/release/libonnxruntime_ep_mlu.so);
//!   argument 1      bevdepth.onnx (default: models/bevdepth.onnx).
//! The defaults are the repository's: from its root, after `cargo build --release --lib`,
//!     ORT_DYLIB_PATH=.venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1 \
//!         cargo run --example usage
//! With the pip package, Python gives all three (docs/USAGE.md shows the lines).
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::Tensor;

/// The file named by `given` (an environment variable or argument), else `default`; when
/// there is none, the program ends with one line saying what to set.
fn input_file(given: Option<OsString>, default: Option<&str>, what: &str, set: &str) -> PathBuf {
    let message = match (given, default) {
        (Some(path), _) if Path::new(&path).is_file() => return path.into(),
        (Some(path), _) => format!("{what} {} does not exist", Path::new(&path).display()),
        (None, Some(default)) if Path::new(default).is_file() => return default.into(),
        (None, Some(default)) => {
            let cwd = std::env::current_dir().unwrap_or_default();
            format!("no {what} given, and no {default} in {}", cwd.display())
        }
        (None, None) => format!("{what} is not set"),
    };
    exit_with(&format!("{message}: {set}"))
}

fn exit_with(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // load-dynamic: ONNX Runtime's C library is opened at run time from this path.
    let dylib = input_file(
        std::env::var_os("ORT_DYLIB_PATH"),
        None,
        "ORT_DYLIB_PATH",
        "set it to ONNX Runtime's libonnxruntime.so, e.g. the onnxruntime wheel's \
         onnxruntime/capi/libonnxruntime.so.1.31.1 (`source scripts/setup.sh` exports it)",
    );
    let lib = input_file(
        std::env::var_os("MLU_EP_LIB"),
        Some("target/release/libonnxruntime_ep_mlu.so"),
        "MLU_EP_LIB",
        "set MLU_EP_LIB to libonnxruntime_ep_mlu.so's path, e.g. the pip package's \
         `python -c 'import onnxruntime_ep_mlu as m; print(m.get_library_path())'`",
    );
    let model = input_file(
        std::env::args_os().nth(1),
        Some("models/bevdepth.onnx"),
        "model argument",
        "give bevdepth.onnx's path as the first argument, e.g. the pip package's \
         `python -c 'import onnxruntime_ep_mlu as m; print(m.models_dir() / \"bevdepth.onnx\")'`",
    );
    let env = ort::init_from(&dylib)?.with_name("usage").build()?;
    let mut session =
        Session::builder(&env)?.with_operator_library(&lib)?.commit_from_file(&model)?;

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

    // The model has four outputs (depth, bev_feat, pos_memo, head); one line on the BEV
    // features, the pooling's result.
    let (shape, bev_feat) = outputs["bev_feat"].try_extract_tensor::<f32>()?;
    let sum: f64 = bev_feat.iter().map(|x| x.abs() as f64).sum();
    println!("bev_feat: float32 {shape:?}, sum of |x| {sum:.3}");
    Ok(())
}

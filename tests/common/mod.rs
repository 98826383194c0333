//! Helpers shared by the integration tests: a seedable generator for test data and the
//! contract's accumulating-class check. Each operator's naive reference stays in its own
//! test file, independent of the kernels and of each other.
#![allow(dead_code)]

pub mod psroi;
mod rng;

pub use rng::Rng;

use onnxruntime_ep_mlu::mlu::{Device, cnrt};
use onnxruntime_ep_mlu::ops::{self, Kernel, LineAlignedOutputs};
use onnxruntime_ep_mlu::parallel::Parallel;
use onnxruntime_ep_mlu::tensor::{Inputs, Tensor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Runs `kernel`, operator `op`, on `tensors` into outputs that start on a 64-byte line, as
/// onnxruntime's do (`ops::run`'s Vecs start wherever the allocator puts them), and returns
/// its first output.
pub fn run_line_aligned(
    kernel: &dyn Kernel,
    op: &str,
    tensors: &[Tensor],
    par: &dyn Parallel,
) -> Tensor {
    let inputs = Inputs::new(
        ops::schema(op).input_names(),
        tensors.iter().map(|t| Some(t.view())).collect(),
    )
    .expect("inputs");
    let mut host = LineAlignedOutputs::default();
    kernel.compute(&inputs, &mut host, par).expect("valid case runs");
    host.into_tensors().remove(0)
}

/// The accumulating class's per-element constant E for float32 outputs: element i passes
/// when |a_i - b_i| <= E (|b_i| + rms(b)) (docs/CONTRACT.md §1.5 defines the rule; the
/// Python judges' `elem_rel`, the same value). Calibration: the worst ratio of the passing
/// float32 results (`cargo test` of the suites that judge, `-- --nocapture` prints each;
/// 2026-12-02) is 1.3e-6 (IndiceConv; VoxelPoolingForward 2.8e-7, PsRoiPoolBackward 4.3e-7,
/// the BANG kernels against the CPU 4.0e-7, DynamicScatter 2.7e-7, PsRoiPool 2.0e-7,
/// ThreeInterpolate 1.4e-7): E is 23 times that, and 10 times below the 3.2e-4 of one
/// element of 0.01 zeroed beside one of 1000 (tests/judge.rs).
pub const ELEM_REL: f64 = 3e-5;

/// E for float16 outputs: a correct float16 result may be one float16 step (up to 2^-10 of
/// the value) from a reference rounded to float16, a ratio up to 9.8e-4, far above
/// [`ELEM_REL`]; this is twice that. Measured: 1.6e-4 (ThreeInterpolate against its
/// float16-rounded reference), 0 (ThreeInterpolateBackward's BANG kernel against the CPU).
/// At this E the counter-example of [`ELEM_REL`] passes: float16 cannot be judged finer.
/// The Python judges' float16 E is `ELEM_REL_F16` of onnxruntime_ep_mlu.regression
/// (`_compare.py`), the same value.
pub const ELEM_REL_F16: f64 = 2e-3;

/// What the accumulating judge measured on an output it passed.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    pub diff1: f64,
    pub diff2: f64,
    /// The largest |a_i - b_i| / (|b_i| + rms(b)), and its element.
    pub worst: f64,
    pub worst_at: usize,
}

/// The contract's accumulating class (docs/CONTRACT.md §1.5) against a float64 reference:
/// diff1 = sum|a-b| / sum|b| <= 3e-3, diff2 = sqrt(sum (a-b)^2 / sum b^2) <= 3e-3, and every
/// element within `elem_rel` (|b_i| + rms(b)), rms over the finite reference elements (with
/// an all-zero reference, the output must be 0). Positions where the reference is not
/// finite must match it in kind (NaN, +inf, -inf) and are left out of the rest; so are
/// positions where the reference is below float32's normal range and the output within 64
/// of float32's smallest steps (2^-149) of it (products of subnormals underflow in float32,
/// not in float64: the fuzz targets found a reference of 2.7e-77 against a float32 0).
/// The one implementation of the judge: the Rust suites and the fuzz oracle (fuzz/src,
/// which includes this module) call it.
pub fn judge_accumulating(got: &[f32], want: &[f64], elem_rel: f64) -> Result<Judged, String> {
    if got.len() != want.len() {
        return Err(format!("length {} against the reference's {}", got.len(), want.len()));
    }
    let (sum2, finite) =
        want.iter().filter(|b| b.is_finite()).fold((0f64, 0usize), |(s, n), &b| (s + b * b, n + 1));
    let rms = if finite == 0 { 0.0 } else { (sum2 / finite as f64).sqrt() };
    let (mut d1, mut n1, mut d2, mut n2) = (0f64, 0f64, 0f64, 0f64);
    let (mut worst, mut worst_at) = (0f64, 0usize);
    let (tiny, steps) = (f64::from(f32::MIN_POSITIVE), 64.0 * f64::from(f32::from_bits(1)));
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        if !b.is_finite() {
            if !((b.is_nan() && a.is_nan()) || (a as f64 == b)) {
                return Err(format!("[{i}]: got {a}, reference {b}"));
            }
            continue;
        }
        let a = a as f64;
        if !a.is_finite() {
            return Err(format!("[{i}]: got {a}, reference {b}"));
        }
        let d = (a - b).abs();
        if b.abs() < tiny && d <= steps {
            continue;
        }
        let ratio = d / (b.abs() + rms);
        if ratio > worst {
            (worst, worst_at) = (ratio, i);
        }
        d1 += d;
        n1 += b.abs();
        d2 += d * d;
        n2 += b * b;
    }
    if n1 == 0.0 {
        return if d1 == 0.0 {
            Ok(Judged { diff1: 0.0, diff2: 0.0, worst: 0.0, worst_at: 0 })
        } else {
            Err(format!("reference all zero, output not (sum|a| {d1:e})"))
        };
    }
    let (diff1, diff2) = (d1 / n1, (d2 / n2).sqrt());
    if worst > elem_rel {
        let (a, b) = (got[worst_at], want[worst_at]);
        return Err(format!(
            "[{worst_at}]: got {a}, reference {b}: |a-b| / (|b| + rms {rms:e}) = {worst:e} > {elem_rel:e} \
             (diff1 {diff1:e} diff2 {diff2:e})"
        ));
    }
    if diff1 > 3e-3 || diff2 > 3e-3 {
        return Err(format!("diff1 {diff1:e} diff2 {diff2:e}"));
    }
    Ok(Judged { diff1, diff2, worst, worst_at })
}

/// The per-element rule for outputs whose elements add a few random signed terms (property
/// tests, fuzz targets): |a_i - b_i| <= elem_rel (|b_i| + t_i), t_i the sum of the magnitudes
/// of the terms element i adds up (the reference computed on the inputs' magnitudes), where
/// float32's rounding lives. Such terms can cancel to almost nothing (the fuzz target found
/// an IndiceConv output 0 against a float64 8.7e-41), and a tensor of a few such elements has
/// no rms, diff1 or diff2 to speak of. Non-finite references as [`judge_accumulating`]; a
/// finite element whose terms' magnitude is not (it overflowed) has no bound, so it must
/// equal the reference exactly. Returns the worst ratio.
pub fn judge_against_terms(
    got: &[f32],
    want: &[f64],
    terms: &[f64],
    elem_rel: f64,
) -> Result<f64, String> {
    if got.len() != want.len() || terms.len() != want.len() {
        return Err(format!(
            "length {} against the reference's {} and its terms' {}",
            got.len(),
            want.len(),
            terms.len()
        ));
    }
    let mut worst = 0f64;
    for (i, ((&a, &b), &t)) in got.iter().zip(want).zip(terms).enumerate() {
        let a = f64::from(a);
        if !b.is_finite() || !a.is_finite() {
            if !((b.is_nan() && a.is_nan()) || a == b) {
                return Err(format!("[{i}]: got {a}, reference {b}"));
            }
            continue;
        }
        if !t.is_finite() {
            if a != b {
                return Err(format!(
                    "[{i}]: got {a}, reference {b}, its terms' magnitude {t}: no bound, so not equal"
                ));
            }
            continue;
        }
        let scale = b.abs() + t;
        let d = (a - b).abs();
        // Below float32's normal range, as judge_accumulating: products of subnormals
        // underflow in float32, not in float64 (the fuzz target: 0 against 2.0e-80).
        if b.abs() < f64::from(f32::MIN_POSITIVE) && d <= 64.0 * f64::from(f32::from_bits(1)) {
            continue;
        }
        if d > elem_rel * scale {
            return Err(format!(
                "[{i}]: got {a}, reference {b}, its terms' magnitude {t}: |a-b| = {d:e} > {elem_rel:e} (|b| + terms)"
            ));
        }
        if scale > 0.0 {
            worst = worst.max(d / scale);
        }
    }
    Ok(worst)
}

/// [`judge_accumulating`] with [`ELEM_REL`], as a test assertion; prints what it measured
/// (shown with `--nocapture`: the calibration of [`ELEM_REL`]).
pub fn assert_accumulating(got: &[f32], want: &[f64], what: &str) {
    assert_accumulating_within(got, want, ELEM_REL, what);
}

/// [`judge_accumulating`] with the per-element constant `elem_rel`, as a test assertion.
pub fn assert_accumulating_within(got: &[f32], want: &[f64], elem_rel: f64, what: &str) {
    match judge_accumulating(got, want, elem_rel) {
        Ok(j) => eprintln!(
            "judged {what}: {} elements, diff1 {:.2e} diff2 {:.2e}, worst element ratio {:.3e} (E {elem_rel:e})",
            got.len(),
            j.diff1,
            j.diff2,
            j.worst
        ),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Plants one wrong element in `got`, which the judge passes, at the element whose reference
/// is the median of the nonzero finite |b| (a typical one, not the largest): zeroed,
/// sign-flipped, 1% off, each in turn; panics unless [`judge_accumulating`] rejects each.
pub fn assert_rejects_planted(got: &[f32], want: &[f64], elem_rel: f64, what: &str) {
    judge_accumulating(got, want, elem_rel).unwrap_or_else(|e| panic!("{what}: unplanted: {e}"));
    let mut nonzero: Vec<(f64, usize)> = want
        .iter()
        .enumerate()
        .filter(|(_, b)| b.is_finite() && **b != 0.0)
        .map(|(i, b)| (b.abs(), i))
        .collect();
    assert!(!nonzero.is_empty(), "{what}: no nonzero reference element to plant a fault at");
    let mid = nonzero.len() / 2;
    let (_, &mut (_, at), _) = nonzero.select_nth_unstable_by(mid, |x, y| x.0.total_cmp(&y.0));
    for (fault, value) in [("zeroed", 0.0), ("sign-flipped", -got[at]), ("1% off", got[at] * 1.01)]
    {
        let mut planted = got.to_vec();
        planted[at] = value;
        if let Ok(j) = judge_accumulating(&planted, want, elem_rel) {
            panic!(
                "{what}: element {at} of {} {fault} ({} -> {value}, reference {}) passes: {j:?}",
                got.len(),
                got[at],
                want[at]
            );
        }
    }
}

/// Bits with +0 == -0 and every NaN alike, for comparing outputs where the contract does
/// not say which zero a max of +0 and -0 is, nor which NaN payload a sum carries.
pub fn canon(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|&x| {
            if x == 0.0 {
                0
            } else if x.is_nan() {
                f32::NAN.to_bits()
            } else {
                x.to_bits()
            }
        })
        .collect()
}

/// The card the kernel tests run on (docs/USAGE.md, "Testing on a card"): with
/// MLU_EP_TEST_DEVICE=<i> the Cambricon runtime's card i (`scripts/test.sh --card` runs the
/// tests once per card), an error if it is missing; with MLU_EP_TEST_DEVICE=emulated, or
/// unset on a host whose runtime lists no card, the emulated card; unset on a card host,
/// card 0. Tests of the emulator itself or of the emulated libmluops use
/// `Device::emulated()` and say so.
pub fn card() -> Arc<Device> {
    static CARD: OnceLock<Arc<Device>> = OnceLock::new();
    let card = CARD.get_or_init(|| {
        let chosen = std::env::var("MLU_EP_TEST_DEVICE").ok();
        let (card, what) = match chosen.as_deref() {
            Some("emulated") => (
                Device::emulated().expect("the emulated card starts"),
                "the emulated card".to_string(),
            ),
            Some(i) => {
                let i: usize = i.parse().unwrap_or_else(|_| {
                    panic!("MLU_EP_TEST_DEVICE={i}: not a card index or 'emulated'")
                });
                let cards = cnrt::devices()
                    .unwrap_or_else(|why| panic!("MLU_EP_TEST_DEVICE={i}: no real card: {why}"));
                let n = cards.len();
                let card = cards.into_iter().nth(i).unwrap_or_else(|| {
                    panic!("MLU_EP_TEST_DEVICE={i}: the runtime lists {n} cards")
                });
                (card, format!("real card {i}"))
            }
            None => match cnrt::devices().map(|cards| cards.into_iter().next()) {
                Ok(Some(card)) => {
                    (card, "real card 0 (MLU_EP_TEST_DEVICE selects another)".to_string())
                }
                Ok(None) => (
                    Device::emulated().expect("the emulated card starts"),
                    "the emulated card (no usable real card)".into(),
                ),
                Err(why) => (
                    Device::emulated().expect("the emulated card starts"),
                    format!("the emulated card ({why})"),
                ),
            },
        };
        eprintln!("kernel tests on {what}: {}", card.info.arch);
        card
    });
    Arc::clone(card)
}

/// The libonnxruntime_ep_mlu.so the session tests load: MLU_EP_LIB when set, else the one
/// cargo built with this test.
pub fn library() -> PathBuf {
    let lib = match std::env::var_os("MLU_EP_LIB") {
        Some(p) => PathBuf::from(p),
        None => {
            // The test runs as target/<profile>/deps/<test>-<hash>. `cargo test` builds the
            // cdylib right next to it (deps/) but uplifts it to target/<profile>/ only on
            // `cargo build`, so the copy in deps/ is the one built with this test; the uplifted
            // one is the fallback.
            let exe = std::env::current_exe().expect("current_exe");
            let dir = exe.parent().expect("test executable has a directory");
            let beside = dir.join("libonnxruntime_ep_mlu.so");
            match (beside.is_file(), dir.ends_with("deps"), dir.parent()) {
                (false, true, Some(profile)) => profile.join("libonnxruntime_ep_mlu.so"),
                _ => beside,
            }
        }
    };
    assert!(
        lib.is_file(),
        "library under test not found at {} (build it with `cargo build --lib`, or set MLU_EP_LIB)",
        lib.display()
    );
    lib
}

/// The ONNX Runtime C library the session tests load (`ort` load-dynamic): ORT_DYLIB_PATH
/// when set, else the onnxruntime wheel's `libonnxruntime.so.<version>` in this checkout's
/// .venv (what scripts/setup.sh installs), so `cargo test` needs nothing sourced.
pub fn ort_dylib_path() -> PathBuf {
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "ORT_DYLIB_PATH={} is not a file", path.display());
        return path;
    }
    // .venv/lib/python3.X/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1
    let venv_lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv").join("lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&venv_lib)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|python| {
            std::fs::read_dir(python.path().join("site-packages/onnxruntime/capi")).ok()
        })
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "ONNX Runtime not found: ORT_DYLIB_PATH is not set and {} holds no onnxruntime wheel; run `scripts/setup.sh` \
             (installs onnxruntime 1.31.1 into .venv) or set ORT_DYLIB_PATH to a libonnxruntime.so",
            venv_lib.display()
        )
    })
}

//! The in-process fuzz harness (docs/VERIFICATION.md, "Coverage-guided fuzzing"). Each
//! target in fuzz_targets/ decodes libFuzzer's bytes into one operator's attributes and
//! inputs ([`Bytes`]), hands them to [`check`], which runs every path the library has, and
//! compares the CPU result with its test suite's contract reference. Any disagreement
//! panics: libFuzzer keeps the input as a crash.

use half::f16;
use libfuzzer_sys::arbitrary::Unstructured;
use onnxruntime_ep_mlu::mlu::Device;
use onnxruntime_ep_mlu::mluops;
use onnxruntime_ep_mlu::ops::device::{Backend, CardBackends, Ran, run_node_on_device};
use onnxruntime_ep_mlu::ops::{self, OwnedOutputs};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::schema::{AttrValue, Attrs};
use onnxruntime_ep_mlu::tensor::{Inputs, OwnedData, Tensor, TensorRef};
use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The test suites' shared helpers (data generator, the contract's accumulating metric).
#[path = "../../tests/common/mod.rs"]
#[allow(clippy::should_implement_trait)]
pub mod common;

/// libFuzzer's bytes as the values a case is built from. Exhausted input reads as zeros,
/// so every byte string decodes to some case.
pub struct Bytes<'a>(Unstructured<'a>);

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes(Unstructured::new(data))
    }
    fn byte(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }
    /// A value in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 { 0 } else { self.0.int_in_range(0..=n - 1).unwrap_or(0) }
    }
    /// True with chance about 1 in `n`.
    pub fn one_in(&mut self, n: u8) -> bool {
        self.byte().is_multiple_of(n.max(1))
    }
    /// A float that makes ties, signed zeros, NaN, infinities and denormals common; the
    /// finite values are small, so no sum of a fuzz case overflows.
    pub fn float(&mut self) -> f32 {
        match self.byte() {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => -0.0,
            4 => 1e-40,
            5 => -3e-39,
            b => (b as i8) as f32 / 8.0,
        }
    }
    /// A finite float in [-16, 16), from two bytes.
    pub fn finite(&mut self) -> f32 {
        let v = u16::from(self.byte()) << 8 | u16::from(self.byte());
        (v as i16) as f32 / 2048.0
    }
    pub fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.float()).collect()
    }
    pub fn finites(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.finite()).collect()
    }
    /// An index into 0..n, or, about one time in `bad`, one just outside it (-1 or n).
    pub fn index(&mut self, n: usize, bad: u8) -> i32 {
        if self.one_in(bad) {
            if self.one_in(2) { -1 } else { n as i32 }
        } else {
            self.below(n) as i32
        }
    }
}

/// How the card's result must match the CPU kernel's (docs/CONTRACT.md §1).
#[derive(Debug, Clone, Copy)]
pub enum Class<'a> {
    /// Bit for bit (index outputs, deterministic kernels).
    Exact,
    /// The contract's accumulating class (atomic or reordered float sums), each float element
    /// against its terms' magnitude ([`common::judge_against_terms`]); index outputs exact.
    /// The inputs are the case's with every term's factors made non-negative, so that the CPU
    /// kernel on them gives, per element, the sum of the magnitudes of the terms it adds
    /// (each target says why for its operator). A card result is judged against those, not
    /// the CPU result's rms: terms that cancel leave an element (or a whole output) near 0
    /// whose rounding lives at the terms' scale (the PsRoiPoolBackward target found 1e-40 +
    /// -13.625 + 4.5 + 9.125, 0 in bin order and 1e-40 in the card's atomics' order).
    Accumulating(&'a [Option<Tensor>]),
}

/// The emulated card and the emulated libmluops (MLU_EP_MLUOPS_LIBRARY, set by
/// scripts/fuzz.sh), opened once per process.
struct Card {
    device: Arc<Device>,
    mluops: onnxruntime_ep_mlu::error::Result<Arc<mluops::Library>>,
}

fn card() -> &'static Card {
    static CARD: OnceLock<Card> = OnceLock::new();
    CARD.get_or_init(|| {
        let lib = std::env::var("MLU_EP_MLUOPS_LIBRARY")
            .expect("MLU_EP_MLUOPS_LIBRARY names the emulated libmluops (scripts/fuzz.sh sets it)");
        let device = Device::emulated().expect("the emulated card exists");
        // Opened for this card: the library's architecture check and mluOpCreate probe.
        let mluops = mluops::open(Some(&lib), &device);
        assert!(
            mluops.is_ok(),
            "the emulated libmluops at {lib} does not open: {:?}",
            mluops.err()
        );
        Card { device, mluops }
    })
}

/// The provider's backend orders each case runs under, from its table: each backend alone,
/// then `auto` (all of them in `Backend::ALL`'s order, the next where one declines at run
/// time), so that a new backend is fuzzed with its row.
fn orders() -> impl Iterator<Item = &'static [Backend]> {
    Backend::ALL.chunks(1).chain(std::iter::once(Backend::ALL))
}

/// How many orders [`orders`] gives.
const ORDERS: usize = Backend::COUNT + 1;

/// Cases and CPU errors, then per order: nodes run on the card, run on the host after a
/// run-time decline, declined at placement (the provider would not claim them).
static COUNTS: [AtomicU64; 2 + 3 * ORDERS] = [const { AtomicU64::new(0) }; 2 + 3 * ORDERS];
const CASES: usize = 0;
const CPU_ERRORS: usize = 1;

fn count(i: usize) -> u64 {
    COUNTS[i].fetch_add(1, Ordering::Relaxed) + 1
}

/// A size limit in an off-card reason: at the fuzz targets' sizes (a few hundred elements)
/// no int32 or NRAM limit can be reached, so such a reason is a bug even where documented.
fn size_limit(why: &str) -> bool {
    static LIMIT: OnceLock<regex::Regex> = OnceLock::new();
    LIMIT
        .get_or_init(|| {
            regex::Regex::new(r"int32|int range|2\^31|beyond the library's int|NRAM")
                .expect("a valid pattern")
        })
        .is_match(why)
}

/// The reasons a valid node may run off the card, each stated in the docs: the session
/// fuzz harness's list (tests/fuzz/offcard.json).
fn documented(why: &str) -> bool {
    static RULES: OnceLock<(Vec<regex::Regex>, regex::Regex)> = OnceLock::new();
    let (rules, backend) = RULES.get_or_init(|| {
        let list: Vec<HashMap<String, String>> =
            serde_json::from_str(include_str!("../../tests/fuzz/offcard.json"))
                .expect("tests/fuzz/offcard.json parses");
        let rules = list
            .iter()
            .map(|r| regex::Regex::new(&r["reason"]).expect("a valid pattern"))
            .collect();
        // Each backend's part of a reason ("mluops: ...; bang: ...") must be documented.
        let names =
            Backend::ALL.iter().map(|b| regex::escape(b.name())).collect::<Vec<_>>().join("|");
        (rules, regex::Regex::new(&format!("; ({names}): ")).expect("a valid pattern"))
    });
    let mut parts = Vec::new();
    let mut from = 0;
    for m in backend.find_iter(why) {
        parts.push(&why[from..m.start()]);
        from = m.start() + 2;
    }
    parts.push(&why[from..]);
    parts.iter().all(|part| rules.iter().any(|r| r.is_match(part)))
}

/// Why nodes ran off the card ("backend: reason", numbers as N), with how often. A reason the
/// docs do not state is a finding.
static OFF_CARD: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

fn off_card(op: &str, why: &str) {
    assert!(
        documented(why),
        "{op}: a valid node ran off the card for a reason the docs do not state: {why}"
    );
    assert!(
        !size_limit(why),
        "{op}: a valid node of a few elements ran off the card for a size limit: {why}"
    );
    let mut text = String::new();
    for ch in why.chars() {
        match (ch.is_ascii_digit(), text.ends_with('N')) {
            (true, true) => {}
            (true, false) => text.push('N'),
            _ => text.push(ch),
        }
    }
    let mut seen = OFF_CARD.lock().unwrap_or_else(|e| e.into_inner());
    match seen.iter_mut().find(|(t, _)| *t == text) {
        Some((_, n)) => *n += 1,
        None => seen.push((text, 1)),
    }
}

/// At every power of two of cases from 1,024 and every multiple of 2^16, the counts so far
/// and the reasons for running off the card on stderr (the long runs' figures,
/// docs/VERIFICATION.md: a run of any length is counted to within 65,536 cases of its end).
/// An order under which nodes were claimed but none ran on the card is a finding: the
/// card-against-CPU comparison would otherwise never have happened.
fn report(cases: u64) {
    if (cases.is_power_of_two() && cases >= 1024) || cases % (1 << 16) == 0 {
        let c: Vec<u64> = COUNTS.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let per_order: String = (0..ORDERS)
            .map(|o| {
                let [card, host, unclaimed] = [2, 3, 4].map(|k| c[k + 3 * o]);
                // The last order is auto's, the others each backend's alone.
                let name = Backend::ALL.get(o).map_or("auto", |b| b.name());
                format!(" | {name} card {card} host {host} unclaimed {unclaimed}")
            })
            .collect();
        eprintln!("fuzz-counts: cases {} cpu_errors {}{per_order}", c[0], c[1]);
        let worst = f64::from_bits(WORST.load(Ordering::Relaxed));
        eprintln!("fuzz-judge: worst element ratio {worst:.3} of its E (accumulating outputs)");
        for (o, order) in orders().enumerate() {
            let (card, host) = (c[2 + 3 * o], c[3 + 3 * o]);
            assert!(
                card > 0 || host == 0,
                "{order:?}: {host} claimed nodes, none of them ran on the card"
            );
        }
        let mut seen = OFF_CARD.lock().unwrap_or_else(|e| e.into_inner()).clone();
        seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        for (why, n) in seen.iter().take(6) {
            eprintln!("fuzz-off-card: {n:>9}  {why}");
        }
    }
}

/// An attribute map from (name, value) pairs.
pub fn attrs(attrs: &[(&str, AttrValue)]) -> HashMap<String, AttrValue> {
    attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// The CPU kernel through the registry, as the custom-op host builds it.
fn cpu(
    op: &str,
    attrs: &HashMap<String, AttrValue>,
    inputs: &[Option<Tensor>],
    par: &dyn Parallel,
) -> Result<Vec<Tensor>, String> {
    let schema = ops::schema(op);
    let entry = ops::entry(op).expect("a registered operator");
    let kernel = (entry.create)(&Attrs::new(schema, attrs)).map_err(|e| e.to_string())?;
    let refs: Vec<Option<TensorRef<'_>>> =
        inputs.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
    let inputs = Inputs::new(schema.input_names(), refs).map_err(|e| e.to_string())?;
    let mut host = OwnedOutputs::named(schema.output_names());
    kernel.compute(&inputs, &mut host, par).map_err(|e| e.to_string())?;
    Ok(host.into_tensors())
}

/// Bits of every element, for exact comparison; every NaN alike (the contract fixes no
/// NaN payload).
pub fn bits(t: &Tensor) -> Vec<u64> {
    match &t.data {
        OwnedData::F32(v) => {
            v.iter().map(|x| if x.is_nan() { 1 << 32 } else { u64::from(x.to_bits()) }).collect()
        }
        OwnedData::F16(v) => {
            v.iter().map(|x| if x.is_nan() { 1 << 32 } else { u64::from(x.to_bits()) }).collect()
        }
        OwnedData::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
        OwnedData::I64(v) => v.iter().map(|&x| x as u64).collect(),
    }
}

/// A float output widened to f64 (`None` for an index output).
pub fn widened(t: &Tensor) -> Option<Vec<f64>> {
    match &t.data {
        OwnedData::F32(v) => Some(v.iter().map(|&x| f64::from(x)).collect()),
        OwnedData::F16(v) => Some(v.iter().map(|x| f16::to_f64(*x)).collect()),
        _ => None,
    }
}

/// The CPU result of a case its target built valid or invalid: a valid case must run, an
/// invalid one must fail ([`check`] has asserted every path gives the same error).
pub fn outcome(result: Result<Vec<Tensor>, String>, valid: bool) -> Option<Vec<Tensor>> {
    match result {
        Ok(out) => {
            assert!(valid, "an invalid case ran");
            Some(out)
        }
        Err(e) => {
            assert!(!valid, "a valid case failed: {e}");
            None
        }
    }
}

/// `got` against `want`: bit for bit, or, with `terms` (each output's terms' magnitude, the
/// CPU kernel on [`Class::Accumulating`]'s inputs), each float element of the accumulating
/// class against its terms' magnitude.
fn same_outputs(what: &str, got: &[Tensor], want: &[Tensor], terms: Option<&[Tensor]>) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w_tensor)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape, w_tensor.shape, "{what}: output {i} shape");
        let t = terms.and_then(|t| t.get(i)).and_then(widened);
        match (t, widened(g), widened(w_tensor)) {
            (Some(t), Some(g), Some(w)) => {
                let g: Vec<f32> = g.iter().map(|&x| x as f32).collect();
                let elem_rel = match w_tensor.data {
                    OwnedData::F16(_) => common::ELEM_REL_F16,
                    _ => common::ELEM_REL,
                };
                judge_terms(&g, &w, &t, elem_rel, &format!("{what}: output {i}"));
            }
            _ => {
                let (g, w) = (bits(g), bits(w_tensor));
                if let Some(k) = (0..g.len()).find(|&k| g[k] != w[k]) {
                    panic!("{what}: output {i}[{k}] bits {:#x}, expected {:#x}", g[k], w[k]);
                }
            }
        }
    }
}

/// The largest per-element ratio any judged output reached, as a fraction of its E
/// (f64 bits: non-negative floats order like their bits), for the report.
static WORST: AtomicU64 = AtomicU64::new(0);

/// The suites' accumulating judge (`common::judge_accumulating`, the one implementation)
/// with per-element constant `elem_rel`: panics on a failure (a finding), and keeps the
/// worst ratio for the report instead of the suites' print per call.
pub fn judge(got: &[f32], want: &[f64], elem_rel: f64, what: &str) {
    match common::judge_accumulating(got, want, elem_rel) {
        Ok(j) => {
            WORST.fetch_max((j.worst / elem_rel).to_bits(), Ordering::Relaxed);
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// [`common::judge_against_terms`] (outputs of a few random signed terms per element), as
/// [`judge`]: panics on a failure and keeps the worst ratio.
pub fn judge_terms(got: &[f32], want: &[f64], terms: &[f64], elem_rel: f64, what: &str) {
    match common::judge_against_terms(got, want, terms, elem_rel) {
        Ok(worst) => {
            WORST.fetch_max((worst / elem_rel).to_bits(), Ordering::Relaxed);
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Runs operator `op` on `inputs` on every path: the CPU kernel at one thread and at two
/// (bit-identical, or the same error; at these sizes most kernels take their one-task path
/// either way), then, for operators a card backend runs, each backend alone and then `auto`
/// on the emulated card through the provider's node runner, when its placement would claim
/// the node. A card result must match the CPU's ([`Class`]), a card error must be the CPU's
/// error word for word. Returns the CPU result.
pub fn check(
    op: &str,
    attrs: &HashMap<String, AttrValue>,
    inputs: &[Option<Tensor>],
    class: Class,
) -> Result<Vec<Tensor>, String> {
    let cases = count(CASES);
    report(cases);
    let serial = cpu(op, attrs, inputs, &Serial);
    let threaded = cpu(op, attrs, inputs, &Threads(2));
    match (&serial, &threaded) {
        (Ok(s), Ok(t)) => same_outputs(&format!("{op}: 2 threads against 1"), t, s, None),
        (Err(s), Err(t)) => assert_eq!(t, s, "{op}: the error at 2 threads against 1"),
        _ => panic!("{op}: 1 thread gave {serial:?}, 2 threads {threaded:?}"),
    }
    if serial.is_err() {
        count(CPU_ERRORS);
    }
    let Some(create) = ops::entry(op).map(|e| e.create_card) else { return serial };
    let card = card();
    let shapes: Vec<Option<Vec<Option<usize>>>> = inputs
        .iter()
        .map(|t| t.as_ref().map(|t| t.shape.iter().map(|&d| Some(d)).collect()))
        .collect();
    // The terms' magnitude per output element, once per case, when a card result needs it.
    let terms = OnceCell::new();
    for (o, order) in orders().enumerate() {
        let backends = CardBackends::new(order).with_mluops(card.mluops.clone());
        let slot = 2 + 3 * o;
        let node = match create(&Attrs::new(ops::schema(op), attrs), &backends) {
            Err(e) => {
                assert_eq!(
                    Err(&e.to_string()),
                    serial.as_ref().map(|_| ()),
                    "{op} on {order:?}: the descriptor's error"
                );
                continue;
            }
            Ok(node) => node,
        };
        if let Err(why) = node.static_choice(&card.device.info, Some(&shapes)) {
            count(slot + 2);
            if serial.is_ok() {
                off_card(op, &format!("unclaimed: {why}"));
            }
            continue;
        }
        let tensors: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
        let what = format!("{op} on {order:?}");
        match (run_node_on_device(&card.device, &node, &tensors), &serial) {
            (Ok((got, ran)), Ok(want)) => {
                count(slot + usize::from(matches!(ran, Ran::Host(_))));
                if let Ran::Host(why) = ran {
                    off_card(op, &why);
                }
                let terms = match class {
                    Class::Exact => None,
                    Class::Accumulating(magnitudes) => Some(
                        terms
                            .get_or_init(|| cpu(op, attrs, magnitudes, &Serial))
                            .as_deref()
                            .unwrap_or_else(|e| panic!("{op}: the terms' magnitude inputs: {e}")),
                    ),
                };
                same_outputs(&what, &got, want, terms);
            }
            (Err(e), Err(want)) => assert_eq!(&e.to_string(), want, "{what}: the error"),
            (got, want) => {
                panic!("{what}: the card gave {:?}, the CPU {want:?}", got.map(|(_, ran)| ran))
            }
        }
    }
    serial
}

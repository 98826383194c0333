//! The provider's report on itself (issue 49's "doctor"): the Cambricon runtime it found,
//! each card and its topology, the kernel library, libmluops on each card, each operator's
//! backend order on each card, and the emulator's state. One text, made here: ONNX Runtime's
//! log gets it at INFO when the factory is created, and `MluEpDoctorReport` (src/lib.rs)
//! hands it to `python -m onnxruntime_ep_mlu.doctor`, so both print the same facts.

use super::EP_NAME;
use crate::mlu::{Device, KERNEL_FAMILIES, cnrt, emulator};
use crate::mluops;
use crate::ops::{self, device::Backend};
use std::fmt::Write;
use std::sync::Arc;

/// The cards this process can use, and why there are none of a kind.
pub struct Found {
    /// Real cards through libcnrt first, then the emulated card.
    pub cards: Vec<(u32, Arc<Device>)>,
    /// Why no real card is in use (`None` when one is).
    pub no_real_card: Option<String>,
    /// Why the emulated card, asked for with `MLU_EP_EMULATE=1`, failed to start.
    pub emulator_failed: Option<String>,
}

impl Found {
    /// The cards of the Cambricon runtime (not the emulated one).
    pub fn real_cards(&self) -> usize {
        self.cards.iter().filter(|(_, d)| !d.info.emulated).count()
    }
}

/// The cards this process can use: real ones through libcnrt, then the emulated card when
/// `MLU_EP_EMULATE=1`.
pub fn discover() -> Found {
    let mut found = Found { cards: Vec::new(), no_real_card: None, emulator_failed: None };
    match cnrt::devices() {
        Ok(devices) => found.cards.extend((0..).zip(devices)),
        Err(why) => found.no_real_card = Some(why.to_string()),
    }
    if emulate() {
        match emulator::device() {
            Ok(d) => found.cards.push((found.cards.len() as u32, d)),
            Err(e) => found.emulator_failed = Some(e.to_string()),
        }
    }
    found
}

fn emulate() -> bool {
    std::env::var("MLU_EP_EMULATE").is_ok_and(|v| v == "1")
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The report on `found`, one fact a line.
pub fn report(found: &Found) -> String {
    let mut out = format!("{EP_NAME} doctor (onnxruntime-ep-mlu {})\n", env!("CARGO_PKG_VERSION"));
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let (path, version) = cnrt::runtime_version();
    line(match version {
        Ok(v) => format!("Cambricon runtime: {path}, version {v}"),
        Err(e) => format!("Cambricon runtime: {path}: {e}"),
    });
    line(match (&found.no_real_card, found.real_cards()) {
        (Some(why), _) => format!("Cambricon cards in use: none: {why}"),
        (None, n) => format!("Cambricon cards in use: {n}"),
    });
    let modes: Vec<String> = ["MLU_EMU_CLUSTERS", "MLU_EMU_FTZ", "MLU_EMU_ASYNC", "MLU_EMU_ORDER"]
        .iter()
        .filter_map(|m| env(m).map(|v| format!("{m}={v}")))
        .collect();
    line(match (emulate(), &found.emulator_failed) {
        (false, _) => "emulated card: off (MLU_EP_EMULATE is not 1)".to_owned(),
        (true, Some(e)) => {
            format!("emulated card: asked for (MLU_EP_EMULATE=1) and failed to start: {e}")
        }
        (true, None) => format!(
            "emulated card: on (MLU_EP_EMULATE=1), modes: {}",
            if modes.is_empty() { "defaults".to_owned() } else { modes.join(", ") }
        ),
    });
    let backend = env("MLU_EP_BACKEND").unwrap_or_else(|| "auto".to_owned());
    let order = Backend::order(&backend);
    let explicit = env("MLU_EP_MLUOPS_LIBRARY");
    for (id, card) in &found.cards {
        let d = &card.info;
        line(format!(
            "card {id}: {} ({}), {} clusters x {} cores, {} bytes of NRAM per core ({} reserved for the stack)",
            d.arch,
            if d.emulated { "emulated on the host" } else { "Cambricon runtime" },
            d.clusters,
            d.cores_per_cluster,
            d.nram_bytes,
            d.nram_reserved_bytes
        ));
        let kernels = if d.emulated {
            "linked into this library (the emulated card's host build)".to_owned()
        } else {
            cnrt::kernel_library_path().unwrap_or_default()
        };
        line(format!("card {id}: kernel library {kernels}"));
        // Per family: its entries resolved, or why not (a family cncc failed on is left out of
        // the library; its nodes run on the other backends).
        for (family, entries) in KERNEL_FAMILIES {
            match d.missing_families.iter().find(|(f, _)| f == family) {
                Some((_, why)) => {
                    line(format!("card {id}: kernel family {family}: MISSING: {why}"))
                }
                None => line(format!(
                    "card {id}: kernel family {family}: entries resolved ({})",
                    entries.iter().map(|e| e.trim_end_matches('\0')).collect::<Vec<_>>().join(", ")
                )),
            }
        }
        let Ok(order) = order else {
            line(format!(
                "card {id}: MLU_EP_BACKEND={backend} is not one of {}",
                Backend::values()
            ));
            continue;
        };
        let mluops = if order.contains(&Backend::MluOps) {
            mluops::open(explicit.as_deref(), card)
        } else {
            Err(crate::error::Error::declined(format!("not opened (MLU_EP_BACKEND={backend})")))
        };
        line(match &mluops {
            Ok(lib) => format!("card {id}: libmluops {lib:?}: mluOpCreate succeeded on this card"),
            Err(why) => format!("card {id}: libmluops not in use: {why}"),
        });
        let mut ops_line = format!("card {id}: backend order (MLU_EP_BACKEND={backend}):");
        for op in ops::ALL {
            let on_card: Vec<&str> = order
                .iter()
                .filter(|b| op.card_backends.contains(b))
                .filter(|b| **b != Backend::MluOps || mluops.is_ok())
                .map(|b| b.name())
                .chain(["cpu"])
                .collect();
            let _ = write!(ops_line, " {}: {};", op.name, on_card.join(", "));
        }
        line(ops_line.trim_end_matches(';').to_owned());
    }
    out.trim_end().to_owned()
}

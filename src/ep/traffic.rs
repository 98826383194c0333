//! The traffic report: with `MLU_EP_TRAFFIC=<path>` set, every run of a claimed node appends
//! one JSON line to `<path>` with the backend that ran it (`mluops`, `bang`, or `cpu` for a
//! run-time fallback), what crossed the card's boundaries during it (`crate::mlu::Traffic`)
//! and the least the operator must read and write (its inputs' and outputs' bytes); and
//! each provider, when its session ends, one `session` line with its counts (nodes claimed
//! per backend, declined with each reason, runs per backend, run-time declines, CPU
//! fallbacks; a fallback's node line has its reasons) and every host<->card byte of the
//! session, the copies ONNX Runtime inserts around CPU nodes included. The counters are per
//! card: nodes that run at the same time on one card share them, so the per-node lines are
//! exact for one node at a time (`models/run_zoo.py --traffic` runs sessions that way).

use crate::mlu::Traffic;
use serde_json::json;
use std::io::Write;
use std::sync::Mutex;

/// The report file, when `MLU_EP_TRAFFIC` names one.
pub fn enabled() -> bool {
    std::env::var_os("MLU_EP_TRAFFIC").is_some()
}

/// The JSON of a traffic span.
pub fn traffic_json(t: &Traffic) -> serde_json::Value {
    json!({
        "h2d": t.host_to_card,
        "d2h": t.card_to_host,
        "d2d": t.card_to_card,
        "memset": t.memset,
        "gdram_read": t.gdram_read,
        "gdram_write": t.gdram_written,
        "launches": t.launches,
        "syncs": t.syncs,
    })
}

/// Appends one node run's line (`why`: the reasons of its run-time declines, or of a
/// fallback to the CPU;
/// `failed`: the run ended in the node's error).
pub fn record(
    op: &str,
    node: &str,
    backend: &str,
    why: Option<&str>,
    failed: bool,
    t: &Traffic,
    minimum: usize,
) {
    let mut line = traffic_json(t);
    line["op"] = json!(op);
    line["node"] = json!(node);
    line["backend"] = json!(backend);
    if let Some(why) = why {
        line["why"] = json!(why);
    }
    if failed {
        line["failed"] = json!(true);
    }
    line["minimum"] = json!(minimum);
    append(&line);
}

/// Appends one line; a report that cannot be written is logged, never an error of the node.
pub fn append(line: &serde_json::Value) {
    static FILE: Mutex<()> = Mutex::new(());
    let Some(path) = std::env::var_os("MLU_EP_TRAFFIC") else { return };
    let text = format!("{line}\n");
    let _one_writer = FILE.lock().unwrap_or_else(|e| e.into_inner());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        log::warn!("MLU_EP_TRAFFIC={}: {e}", path.to_string_lossy());
    }
}

//! The driver's checks on the card: the value rules' check kernels (kernels/check) and
//! their records, and the int32 limits every path's sizes are held to.

use super::DeviceOutputs;
use crate::error::{Error, Result};
use crate::mlu::abi::{CheckKernels, IntBounds};
use crate::mlu::{Device, Direction, NRAM_BUDGET, Queue, TASK_UNION1};
use crate::ops::rules::{Broken, Check, RowValues, ValueRule};
use crate::tensor::Inputs;
use std::ffi::c_void;
use std::sync::Arc;

/// Enqueues kernels/check for `rule` over `numel` elements at `data`, writing `record`.
pub(super) fn launch_check(
    device: &Arc<Device>,
    queue: &Queue,
    rule: &ValueRule,
    data: *const c_void,
    numel: usize,
    record: *mut i32,
    outputs: &mut dyn DeviceOutputs,
) -> Result<()> {
    // One cluster: the check's __sync_all_ipu reaches the cores of one cluster only.
    let tasks = device.info.cores_per_cluster;
    let task_first: *mut i32 = outputs.workspace(tasks as usize * 4)?.cast();
    let cols = rule.check.cols();
    // NRAM: the tasks' slots and one tile of rows, each rounded up to 64 bytes.
    let tile_rows =
        ((NRAM_BUDGET - 2 * 64 - tasks as usize * 4) / (cols * 4)).min(i32::MAX as usize);
    let (rows, cols, tile_rows) =
        (bounded("rows", numel / cols)?, bounded("cols", cols)?, bounded("tile_rows", tile_rows)?);
    let k = device.kernels::<CheckKernels>()?;
    match rule.check {
        Check::Int { bounds, .. } => {
            let b = IntBounds { lo: bounds.map(|b| b.0), hi: bounds.map(|b| b.1) };
            // SAFETY: `data` is the rule's input, `rows * cols` int32 in card memory (or
            // null for none); `task_first` and `record` are card scratch of the sizes the
            // kernel writes; the launch only enqueues.
            queue.launch("bang_check_int_rows", |q| unsafe {
                (k.bang_check_int_rows)(
                    q,
                    tasks,
                    TASK_UNION1,
                    data.cast(),
                    rows,
                    cols,
                    &b,
                    tile_rows,
                    task_first,
                    record,
                )
            })
        }
        Check::GuardedFloat { col, above, below, .. } => {
            let col = bounded("col", col)?;
            // SAFETY: as above, for float32 rows.
            queue.launch("bang_check_float_rows", |q| unsafe {
                (k.bang_check_float_rows)(
                    q,
                    tasks,
                    TASK_UNION1,
                    data.cast(),
                    rows,
                    cols,
                    col,
                    above,
                    below,
                    tile_rows,
                    task_first,
                    record,
                )
            })
        }
    }
}

/// After the queue's synchronisation: the first broken rule, with its row read from the card.
pub(super) fn read_records(
    device: &Device,
    inputs: &Inputs<'_>,
    rules: &[ValueRule],
    records: *const i32,
    device_inputs: &[*const c_void],
) -> Result<Option<Broken>> {
    if rules.is_empty() {
        return Ok(None);
    }
    let mut found = crate::scratch::filled(rules.len(), -1i32, "the value checks' records")?;
    // SAFETY: `records` holds one int32 per rule, written by the check kernels.
    unsafe {
        device.copy_raw(
            found.as_mut_ptr().cast(),
            records.cast(),
            found.len() * 4,
            Direction::DeviceToHost,
        )?
    };
    let Some((rule, row)) =
        found.iter().enumerate().find_map(|(k, &r)| usize::try_from(r).ok().map(|row| (k, row)))
    else {
        return Ok(None);
    };
    let cols = rules[rule].check.cols();
    let first = rules[rule].elements(inputs.numel(rules[rule].input).unwrap_or(0)).start;
    let src = device_inputs[rules[rule].input].cast::<u8>();
    // SAFETY: the check kernel found row `row` inside the rule's part of the input, `cols`
    // 4-byte values each.
    let src = unsafe { src.add((first + row * cols) * 4) }.cast::<c_void>();
    let values = match rules[rule].check {
        Check::Int { .. } => {
            let mut v = vec![0i32; cols];
            // SAFETY: `v` holds `cols` int32; `src` is that row in card memory.
            unsafe {
                device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)?
            };
            RowValues::I32(v)
        }
        Check::GuardedFloat { .. } => {
            let mut v = vec![0f32; cols];
            // SAFETY: as above, float32.
            unsafe {
                device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)?
            };
            RowValues::F32(v)
        }
    };
    Ok(Some(Broken { rule, row, values }))
}

/// The input shapes of a node as the graph declares them: `None` for an absent input,
/// `None` for a symbolic dimension.
pub type StaticShapes = [Option<Vec<Option<usize>>>];

/// Dimension `axis` of input `input` when it is static.
pub fn static_dim(shapes: &StaticShapes, input: usize, axis: usize) -> Option<usize> {
    shapes.get(input)?.as_ref()?.get(axis).copied().flatten()
}

/// The element count of a fully static shape.
pub fn static_numel(shape: &[Option<usize>]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| d.map(|d| a.saturating_mul(d)))
}

/// Declines an output of (static dims `axes` of input `input`) x `times` elements beyond
/// the kernels' int32 element offsets; `what` names the product in the reason. Unknown
/// (symbolic) dims are checked at run time instead.
pub fn int32_output(
    shapes: &StaticShapes,
    input: usize,
    axes: [usize; 2],
    times: usize,
    what: &str,
) -> Result<()> {
    let dims = shapes.get(input).and_then(|s| s.as_ref());
    if let Some([Some(a), Some(b)]) = dims.map(|d| axes.map(|i| d.get(i).copied().flatten())) {
        let n = a.saturating_mul(b).saturating_mul(times);
        if n > i32::MAX as usize {
            return Err(Error::declined(format!(
                "the output's {what} = {n} elements exceed the MLU kernel's int32 offsets"
            )));
        }
    }
    Ok(())
}

/// Every statically known input fits the kernels' int32 element offsets.
pub fn int32_inputs(shapes: &StaticShapes) -> Result<()> {
    for (i, s) in shapes.iter().enumerate() {
        if let Some(n) = s.as_deref().and_then(static_numel).filter(|&n| n > i32::MAX as usize) {
            return Err(Error::declined(format!(
                "input {i} has {n} elements, beyond the MLU kernels' int32 offsets"
            )));
        }
    }
    Ok(())
}

/// A run-time size narrowed to the kernels' int32, or the reason it cannot be (for a
/// path's fit: the node then goes to the next path before anything is launched).
pub fn narrow(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::declined(format!("MLU kernel argument {what} = {v} exceeds int32")))
}

/// A size the checks before it have bounded, as the kernels' int32: beyond int32 is a bug
/// (a runtime error), never a decline.
pub fn bounded(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::Runtime(format!("{what} = {v} beyond int32 after its limits were checked"))
    })
}

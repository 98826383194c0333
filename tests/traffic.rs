//! The emulated card's traffic counters (src/mlu/traffic.rs) against what a known kernel
//! launch and known copies must move. One test in its own process: the emulator's GDRAM
//! counters are process-wide.

use onnxruntime_ep_mlu::mlu::abi::{CheckKernels, IntBounds};
use onnxruntime_ep_mlu::mlu::{Device, Direction, TASK_UNION1};

#[test]
fn a_check_kernel_and_its_copies_are_counted_exactly() {
    let d = Device::emulated().expect("emulated card");
    let tasks = d.info.cores_per_cluster;
    let before = d.traffic();
    let rows = 1000usize;
    let data = d.upload(&vec![1i32; rows]).unwrap();
    // task_first (one int32 per task), then the record.
    let scratch = d.alloc((tasks as usize + 1) * 4).unwrap();
    let (first, record) = (scratch.ptr::<i32>(), scratch.ptr::<i32>().wrapping_add(tasks as usize));
    let bounds = IntBounds { lo: [0; 4], hi: [5; 4] };
    let q = d.queue().unwrap();
    let k = d.kernels::<CheckKernels>().unwrap();
    // SAFETY: `data` holds `rows` int32; `scratch` the task slots and the record.
    q.launch("bang_check_int_rows", |qp| unsafe {
        (k.bang_check_int_rows)(
            qp,
            tasks,
            TASK_UNION1,
            data.ptr(),
            rows as i32,
            1,
            &bounds,
            4096,
            first,
            record,
        )
    })
    .unwrap();
    q.sync().unwrap();
    let mut found = [0i32];
    // SAFETY: `record` is one int32 of `scratch`; `found` has room for it.
    unsafe {
        d.copy_raw(
            found.as_mut_ptr().cast(),
            record.cast_const().cast(),
            4,
            Direction::DeviceToHost,
        )
        .unwrap()
    };
    assert_eq!(found, [-1], "every value is within [0, 5]");
    let t = d.traffic().since(&before);
    let slots = u64::from(tasks) * 4;
    assert_eq!(
        (t.host_to_card, t.card_to_host, t.card_to_card, t.memset),
        (rows as u64 * 4, 4, 0, 0)
    );
    assert_eq!((t.launches, t.syncs), (1, 1));
    // Each task reads its rows and writes its slot; task 0 then reads every slot and writes
    // the record.
    assert_eq!(t.gdram_read, Some(rows as u64 * 4 + slots));
    assert_eq!(t.gdram_written, Some(slots + 4));
}

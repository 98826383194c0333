//! Opening the library: statuses, the version bound, stand-in libraries missing a symbol,
//! failing mluOpCreate or too new for the card's architecture, and the candidates tried in
//! order.

use super::*;

#[test]
fn statuses_name_the_call_and_the_status() {
    let lib = library().expect("the emulated library opens");
    let err = lib
        .tensor(Layout::Array, DType::Float, &[])
        .err()
        .expect("dimNb 0 is BAD_PARAM")
        .to_string();
    assert_eq!(
        err,
        "MLU-OPS mluOpSetTensorDescriptor returned MLUOP_STATUS_BAD_PARAM (3): MLUOP_STATUS_BAD_PARAM"
    );
    // NOT_SUPPORTED, a scale limitation the binding did not model, sends the node to the
    // next path (a run-time decline); every other failure is the node's error.
    let limit = lib.check("mluOpX", mluops::NOT_SUPPORTED).expect_err("a failure");
    assert!(
        matches!(limit, onnxruntime_ep_mlu::error::Error::Declined(ref m) if m.contains("MLUOP_STATUS_NOT_SUPPORTED")),
        "{limit:?}"
    );
    let failed = lib.check("mluOpX", 6).expect_err("a failure");
    assert!(matches!(failed, onnxruntime_ep_mlu::error::Error::Runtime(_)), "{failed:?}");
}

#[test]
fn a_version_outside_the_bound_range_is_refused() {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let path = emulated_library();
    // A refused library is never cached, so each open asks its version again.
    let dir = tempdir();
    let copy = dir.join("libmluops.so");
    std::fs::copy(&path, &copy).expect("copy the emulated library");
    // SAFETY: this test holds OPENING, the lock of every open in this process's tests.
    unsafe { std::env::set_var("MLUOPS_EMULATED_VERSION", "2.0.0") };
    let refused = mluops::open(Some(copy.to_str().expect("UTF-8")), &device());
    // SAFETY: as above.
    unsafe { std::env::remove_var("MLUOPS_EMULATED_VERSION") };
    let why = refused.expect_err("2.0.0 is outside 1.4.0..1.9.x").to_string();
    assert!(why.contains("is MLU-OPS 2.0.0") && why.contains("1.4.0 to 1.9.x"), "{why}");
    assert!(
        mluops::open(Some(copy.to_str().expect("UTF-8")), &device()).is_ok(),
        "1.4.0 is accepted"
    );
    let missing = mluops::open(Some("/nonexistent/libmluops.so"), &device())
        .expect_err("no such file")
        .to_string();
    assert!(
        missing.contains("no usable MLU-OPS library")
            && missing.contains("/nonexistent/libmluops.so: ")
            && missing.contains("mluops_library"),
        "{missing}"
    );
}

/// A stand-in libmluops in C, built with the system `cc` into `dir/name`: every function of
/// `mluops::SIGNATURES` except `omit`, reporting `version`, its `mluOpCreate` returning
/// `create`, the other functions failing with MLUOP_STATUS_INTERNAL_ERROR; `extra` is
/// appended to the source.
fn stand_in(
    dir: &Path,
    name: &str,
    version: (i32, i32, i32),
    create: i32,
    omit: &[&str],
    extra: &str,
) -> PathBuf {
    let (major, minor, patch) = version;
    let special = [
        ("mluOpGetLibVersion", format!("void mluOpGetLibVersion(int *a, int *b, int *c) {{ *a = {major}; *b = {minor}; *c = {patch}; }}")),
        ("mluOpGetErrorString", "const char *mluOpGetErrorString(int s) { return s == 1 ? \"MLUOP_STATUS_NOT_INITIALIZED\" : \"stand-in\"; }".to_owned()),
        ("mluOpCreate", format!("int mluOpCreate(void **h) {{ *h = (void *)0; return {create}; }}")),
    ];
    let mut c = String::new();
    for sig in mluops::SIGNATURES.iter().filter(|s| !omit.contains(&s.name)) {
        match special.iter().find(|(n, _)| *n == sig.name) {
            Some((_, def)) => c.push_str(def),
            None => c.push_str(&format!("int {}() {{ return 4; }}", sig.name)),
        }
        c.push('\n');
    }
    c.push_str(extra);
    std::fs::create_dir_all(dir).expect("stand-in dir");
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, c).expect("stand-in source");
    let lib = dir.join(name);
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(out.status.success(), "cc {name}: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

#[test]
fn a_library_missing_a_symbol_is_refused_when_opened_never_at_a_call() {
    let dir = tempdir().join("missing");
    // A dependency symbol (CNNL's, which libmluops calls) that nothing provides: with lazy
    // binding the open succeeds and the first call aborts the process; RTLD_NOW refuses it.
    let unbound = stand_in(
        &dir,
        "libmluops_unbound.so",
        (1, 4, 0),
        0,
        &["mluOpPsRoiPoolForward"],
        "int cnnlFill_v3(void);\nint mluOpPsRoiPoolForward() { return cnnlFill_v3(); }\n",
    );
    let why = mluops::open(Some(path_str(&unbound)), &device()).expect_err("unbound").to_string();
    assert!(why.contains("cnnlFill_v3") && why.contains(path_str(&unbound)), "{why}");
    // One of the functions the provider binds is absent.
    let lacking =
        stand_in(&dir, "libmluops_lacking.so", (1, 4, 0), 0, &["mluOpPsRoiPoolBackward"], "");
    let why = mluops::open(Some(path_str(&lacking)), &device()).expect_err("lacking").to_string();
    assert!(why.contains("lacks mluOpPsRoiPoolBackward"), "{why}");
}

#[test]
fn a_failing_mluopcreate_declines_the_backend_with_its_status_and_auto_runs_bang() {
    let dir = tempdir().join("create");
    let lib = stand_in(&dir, "libmluops_create.so", (1, 4, 0), 1, &[], "");
    let refused = mluops::open(Some(path_str(&lib)), &device());
    let why = refused.as_ref().expect_err("mluOpCreate fails").to_string();
    assert!(why.contains("mluOpCreate returned MLUOP_STATUS_NOT_INITIALIZED (1)"), "{why}");
    // The probe is made once per card: asked again, the same answer without a second call.
    let again = mluops::open(Some(path_str(&lib)), &device()).expect_err("still refused");
    assert_eq!(again.to_string(), why);
    // `auto` then passes MLU-OPS over at placement, with that reason, for our kernels.
    let max: HashMap<String, AttrValue> =
        [("reduce_type".to_owned(), AttrValue::String("max".into()))].into();
    let create = ops::entry("DynamicScatterBackward").map(|e| e.create_card).expect("card op");
    let backends = CardBackends::new(AUTO).with_mluops(refused);
    let n =
        create(&Attrs::new(ops::schema("DynamicScatterBackward"), &max), &backends).expect("valid");
    let (first, passed_over) = n.static_choice(&device().info, None).expect("BANG runs it");
    assert_eq!(first, Backend::Bang);
    assert!(
        passed_over.len() == 1
            && passed_over[0].starts_with("mluops: ")
            && passed_over[0].contains("NOT_INITIALIZED"),
        "{passed_over:?}"
    );
}

#[test]
fn a_library_too_new_for_the_cards_architecture_is_refused_naming_both() {
    let dir = tempdir().join("arch");
    let new = stand_in(&dir, "libmluops_160.so", (1, 6, 0), 0, &[], "");
    let why =
        mluops::open(Some(path_str(&new)), &device()).expect_err("1.6.0 on mtp_372").to_string();
    assert!(
        why.contains("MLU-OPS 1.6.0") && why.contains("mtp_372") && why.contains("1.5.x or older"),
        "{why}"
    );
    let old = stand_in(&dir, "libmluops_152.so", (1, 5, 2), 0, &[], "");
    let lib = mluops::open(Some(path_str(&old)), &device()).expect("1.5.2 builds for mtp_372");
    assert_eq!(lib.version, (1, 5, 2));
}

#[test]
fn every_candidate_is_tried_in_order_and_each_failure_is_kept() {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir().join("candidates");
    let (broken, good) = (dir.join("mluops_home"), dir.join("neuware"));
    stand_in(&broken.join("lib64"), "libmluops.so", (1, 4, 0), 0, &["mluOpCreate"], "");
    std::fs::create_dir_all(good.join("lib64")).expect("lib64");
    let good_lib = good.join("lib64/libmluops.so.1");
    std::fs::copy(emulated_library(), &good_lib).expect("copy the emulated library");
    // SAFETY: this test holds OPENING, the lock of every open that reads the environment.
    unsafe {
        std::env::set_var("MLUOPS_HOME", &broken);
        std::env::set_var("NEUWARE_HOME", &good);
    }
    let order = mluops::candidates(None);
    let lib = mluops::open(None, &device());
    let mut other = order.clone();
    // SAFETY: as above.
    unsafe { std::env::remove_var("NEUWARE_HOME") };
    let none = mluops::open(None, &device());
    // SAFETY: as above.
    unsafe { std::env::remove_var("MLUOPS_HOME") };
    let home = |d: &Path, rest: &str| format!("{}/{rest}", d.display());
    assert_eq!(
        order,
        [
            home(&broken, "lib64/libmluops.so"),
            home(&broken, "lib64/libmluops.so.1"),
            home(&broken, "build/lib/libmluops.so"),
            home(&broken, "build/lib/libmluops.so.1"),
            home(&good, "lib64/libmluops.so"),
            home(&good, "lib64/libmluops.so.1"),
            "libmluops.so".to_owned(),
            "libmluops.so.1".to_owned(),
        ]
    );
    assert_eq!(lib.expect("the second home's library").path, path_str(&good_lib));
    other.retain(|p| !p.starts_with(path_str(&good)));
    let why = none.expect_err("only the broken one").to_string();
    let tried: Vec<&str> =
        why.split("(tried, in order: ").nth(1).expect("the candidates").split("; ").collect();
    for (p, t) in other.iter().zip(&tried) {
        assert!(t.starts_with(&format!("{p}: ")), "{p} in order in: {why}");
    }
    assert!(why.contains("lacks mluOpCreate"), "{why}");
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mluops-backend-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

//! splitmix64: small, seedable, good enough for test data and fixture weights. The one
//! generator of the integration tests (tests/common), the fuzz harness (fuzz/src/lib.rs),
//! the benchmarks (benches/ops.rs, benches/indice_conv.rs) and the model zoo (models/zoo.rs),
//! each of which takes this file by `#[path]`: a module of the library would be public API,
//! and a crate of its own a dependency of all of them for eight lines. Users add the
//! conveniences they need in their own `impl Rng` blocks.

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

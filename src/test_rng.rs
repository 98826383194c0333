//! The unit tests' deterministic random numbers.

/// The xorshift64 sequence (13, 7, 17) after `state`, which must not be 0.
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

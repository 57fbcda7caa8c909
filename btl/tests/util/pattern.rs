//! Test payloads shared by the simulated and the device tests.

/// Bytes of a test message: a pattern from a seed and the length, so that
/// a message of one seed and length cannot pass for another.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(len as u32) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
